"""What a rank holds of a checkpoint's arrays and values, whatever the layout.

Saving and loading read the same description of a rank's state: a list of
*parts* (global name, global shape, which part of the array: ``box`` and
``flat``, and the local array, which a save reads and a load writes in
place) and a dict of *values* (global name -> the rank's value, with a
setter for loading). How a layout holds an array decides its part:

===============================  ==================================================
the array's owner                this rank's part
===============================  ==================================================
one process, or model pieces     the whole array
(MultiNodeChainList, pipelines)
plain data parallelism           the whole array, replicated over the data axis: each
                                 replica writes a balanced flat range of it
sharded data parallelism         its shard of the optimizer state: a flat range of
                                 the array; the parameters as plain data parallelism
                                 (stages 1, 2) or their shard (stage 3)
a tensor-parallel cut            the block ``box`` (its cut along one axis)
``mnpar_replicas()`` of a link   replicated over that communicator too: split further
===============================  ==================================================

Names: ``model:<optimizer name>/<global path>`` for parameters and
persistent values, ``optimizer:<name>/<global path>/<state>`` for update
rule states and ``optimizer:<name>/<global path>/t``, ``optimizer:<name>/t``
and ``/epoch`` for its counters, ``trainer/<chainer path>`` for everything
else a trainer serializes (the iteration, iterators, extensions).
"""
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import chainer
import numpy as np

from ..optimizers._shards import balanced
from ._format import Box
from ._names import global_paths, join, parameter_names


class Part(NamedTuple):
    """This rank's part of a global array (see the module docstring)."""

    name: str
    shape: Tuple[int, ...]
    dtype: np.dtype
    box: Box
    flat: Tuple[int, int]
    array: Any  # the part's elements, in any shape (read by a save, written by a load)
    writes: bool  # this rank writes it (replicas split the writing)


class Value(NamedTuple):
    """A value this rank holds: its current content and how a load sets it."""

    value: Any
    assign: Optional[Callable[[Any], None]]  # None: set by the trainer walk (``_trainer``)


class Holdings:
    """The parts and values of one rank (see the module docstring)."""

    def __init__(self, split: bool = True) -> None:
        self.split = split  # replicas each take a share of what they hold alike (a save)
        self.parts: List[Part] = []
        self.values: Dict[str, Value] = {}
        self.layout: List[str] = []

    def add_whole(self, name: str, array: Any, replicas: Sequence[Any] = ()) -> None:
        """``array`` is the whole global array, replicated over ``replicas`` (comms)."""
        self.add(name, tuple(array.shape), array.dtype, None, (0, int(array.size)), array,
                 replicas)

    def add(self, name: str, shape: Tuple[int, ...], dtype: Any, box: Box,
            flat: Tuple[int, int], array: Any, replicas: Sequence[Any] = ()) -> None:
        """Adds a part; over ``replicas`` each rank writes a balanced share of ``flat``."""
        writes = True
        if replicas and self.split:
            count, index = 1, 0
            for comm in replicas:
                index = index * comm.size + comm.rank
                count *= comm.size
            lo, hi = balanced(flat[1] - flat[0], count)[index]
            array = array.reshape(-1)[lo: hi]
            flat = (flat[0] + lo, flat[0] + hi)
            writes = hi > lo
        self.parts.append(Part(name, tuple(int(s) for s in shape), np.dtype(dtype), box, flat,
                               array, writes))


def _cut_region(p: Any, local_shape: Tuple[int, ...]) -> Tuple[Tuple[int, ...], Box]:
    """The global shape and the block of a tensor-parallel cut parameter (``_mnpar_cut``),
    or its own shape and None."""
    cut = getattr(p, "_mnpar_cut", None)
    if cut is None:
        return local_shape, None
    r, axis = cut.comm.rank, cut.axis
    shape = list(local_shape)
    shape[axis] = int(cut.bounds[-1])
    box = [(0, int(n)) for n in shape]
    box[axis] = (int(cut.bounds[r]), int(cut.bounds[r + 1]))
    return tuple(shape), box


def _replicas(model: chainer.Link) -> Dict[int, List[Any]]:
    """id of a parameter -> communicators its links declare it replicated over."""
    out: Dict[int, List[Any]] = {}
    for link in model.links():
        declare = getattr(link, "mnpar_replicas", None)
        if not callable(declare):
            continue
        for comm, params in declare():
            items = params.params() if isinstance(params, chainer.Link) else params
            for p in items:
                if all(c is not comm for c in out.get(id(p), [])):
                    out.setdefault(id(p), []).append(comm)
    return out


def add_model(h: Holdings, optimizer: Any, name: str, names: Any,
              index: Optional[Any] = None) -> None:
    """The parameters, persistent values and optimizer state of ``optimizer`` and its
    model (a chainer optimizer, or an mnpar multi-node or sharded one). For a load
    (``index`` given), parameters not yet initialized take the checkpoint's shapes and
    update rules without state get it where the checkpoint has some."""
    model = optimizer.target
    inner = getattr(optimizer, "actual_optimizer", optimizer)
    data = getattr(optimizer, "communicator", None)
    stage = getattr(optimizer, "stage", 0)
    global_of = parameter_names(model, names)
    if index is not None:
        if stage < 3:  # stage 3 holds no whole parameter: its shards are its own
            _initialize(model, global_of, name, index)
        if stage:
            optimizer.ensure_built()
    mirror: Any = optimizer.mirror if stage else None
    h.layout.append(_layout_text(optimizer, stage, data))
    replicas = _replicas(model)
    slots = _shard_slots(optimizer) if stage else {}
    for local, p in sorted(model.namedparams()):
        g = global_of[local].lstrip("/")
        over = [c for c in replicas.get(id(p), []) if c is not data]
        if stage:  # the shard: the state's, and stage 3's parameter
            shape, dtype, piece = slots[local]
            shape, box = _cut_region(p, shape)
            holder = mirror.shard_of(p)
            flat, size = (piece.start, piece.stop), piece.size
        elif p.array is not None:
            shape, box = _cut_region(p, tuple(p.array.shape))
            dtype, holder = p.array.dtype, p
            flat, size = (0, int(p.array.size)), int(p.array.size)
        else:
            continue
        copies = ([data] if data is not None else []) + over  # what the data axis holds alike
        if stage in (1, 2):  # the parameter whole on every rank of the data axis
            h.add(f"model:{name}/{g}", shape, dtype, box, (0, int(p.array.size)), p.array,
                  copies)
        else:
            h.add(f"model:{name}/{g}", shape, dtype, box, flat, holder.array,
                  over if stage else copies)
        rule = getattr(holder, "update_rule", None)
        if rule is None:
            continue
        if index is not None and rule.state is None and any(
                k.startswith(f"optimizer:{name}/{g}/") for k in index.arrays):
            rule._init_states(holder)
        for key, a in _rule_arrays(rule, size).items():
            h.add(f"optimizer:{name}/{g}/{key}", shape, a.dtype, box, flat, a,
                  over if stage else copies)
        h.values[f"optimizer:{name}/{g}/t"] = Value(rule.t, _setter(rule, "t"))
    _add_persistents(h, model, name, names)
    h.values[f"optimizer:{name}/t"] = Value(inner.t, _setter(inner, "t"))
    h.values[f"optimizer:{name}/epoch"] = Value(inner.epoch, _setter(inner, "epoch"))


def _initialize(model: chainer.Link, global_of: Dict[str, str], name: str, index: Any) -> None:
    """Parameters without data take the shape of their array in the checkpoint (as
    chainer's ``load_npz`` initializes them)."""
    for local, p in sorted(model.namedparams()):
        entry = index.arrays.get(f"model:{name}/{global_of[local].lstrip('/')}")
        if p.array is None and entry is not None and getattr(p, "_mnpar_cut", None) is None:
            p.initialize(entry.shape)


def _shard_slots(optimizer: Any) -> Dict[str, Tuple[Tuple[int, ...], np.dtype, Any]]:
    """Local path of every parameter -> (its shape, dtype, this rank's piece)."""
    out = {}
    for g in optimizer.groups:
        for slot, name in enumerate(g.names):
            out[name] = (g.layout.slots[slot].shape, g.dtype, g.pieces[slot])
    return out


def _rule_arrays(rule: Any, size: int) -> Dict[str, Any]:
    """The state arrays of ``rule`` with one element per element of its parameter."""
    state = getattr(rule, "state", None) or {}
    return {k: a for k, a in sorted(state.items())
            if hasattr(a, "shape") and int(np.prod(a.shape)) == size}


def _setter(obj: Any, attr: str) -> Callable[[Any], None]:
    def assign(value: Any) -> None:
        setattr(obj, attr, value)
    return assign


def _add_persistents(h: Holdings, model: chainer.Link, name: str, names: Any) -> None:
    paths = global_paths(model, names)
    for _, link in sorted(model.namedlinks()):
        if id(link) not in paths:
            continue
        for attr in sorted(link._persistent):
            g = join(paths[id(link)], attr).lstrip("/")
            h.values[f"model:{name}/{g}"] = Value(link.__dict__[attr],
                                                  _persistent_setter(link, attr))


def _persistent_setter(link: chainer.Link, attr: str) -> Callable[[Any], None]:
    def assign(value: Any) -> None:
        link.__dict__[attr] = value
    return assign


def _layout_text(optimizer: Any, stage: int, data: Any) -> str:
    kind = type(getattr(optimizer, "actual_optimizer", optimizer)).__name__
    if data is None:
        return f"{kind} without data parallelism"
    how = f"stage {stage} sharded" if stage else "plain data parallel"
    return f"{kind}, {how} over {data.size} data rank(s)"
