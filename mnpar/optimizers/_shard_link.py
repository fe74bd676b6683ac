"""The link the wrapped optimizer updates: the model's tree, holding this rank's shards.

A sharded optimizer sets the wrapped chainer optimizer up on a *mirror* of
the model: a ``chainer.Chain`` for every link of the model, under the same
names, and in each, for every parameter, a ``chainer.Parameter`` whose data
and gradient are this rank's shard of it (1-D, possibly empty)::

    model                    mirror (rank 1 of 2)
    /l1/W  (4, 3)            /l1/W  (6,)   elements 6..11 of the flattened W
    /l1/b  (4,)              /l1/b  (4,)   ...

The optimizer's update rules, hooks, ``t`` and ``serialize`` therefore work
on the shards unchanged, and names in messages are the model's. Each model
parameter's ``update_rule`` is its shard's, so setting a hyperparameter on
``model.l1.W.update_rule`` reaches the rule that runs.

The mirror declares its parameters to ``mnpar.optimizer_hooks.GradientClipping``:
``mnpar_shards()`` (pieces over the data axis: their squares are summed over
it) and ``mnpar_replicas()`` (the model's own declarations, carried over to
the shards, except those over the data axis itself, over which shards are
not replicas).
"""
from typing import Any, Dict, List, Tuple

import chainer

from ..communicators._facade import Communicator


def _owner_path(name: str) -> Tuple[str, str]:
    """``('/a/b', 'W')`` for ``'/a/b/W'``; ``('/', 'W')`` for ``'/W'``."""
    head, _, tail = name.rpartition("/")
    return head or "/", tail


class Mirror(chainer.Chain):
    """The mirror's root (see the module docstring); built by :func:`build_mirror`."""

    def __init__(self, comm: Communicator, model: chainer.Link) -> None:
        super().__init__()
        self._mnpar_comm = comm
        self._mnpar_model = model
        self._mnpar_of: Dict[int, chainer.Parameter] = {}  # id(model param) -> shard param

    def mnpar_shards(self) -> List[Tuple[Communicator, List[chainer.Parameter]]]:
        """Every parameter here is a piece of one over the data axis: summed over it once."""
        return [(self._mnpar_comm, list(self.params()))]

    def mnpar_replicas(self) -> List[Tuple[Communicator, List[chainer.Parameter]]]:
        """The model's own replica declarations (``mnpar_replicas()`` of its links), on the
        shards; a declaration over the data axis itself is dropped (shards differ there)."""
        out = []
        for link in self._mnpar_model.links():
            declare = getattr(link, "mnpar_replicas", None)
            if not callable(declare):
                continue
            for comm, params in declare():
                if comm is self._mnpar_comm:
                    continue
                items = list(params.params()) if isinstance(params, chainer.Link) else params
                mapped = [self._mnpar_of[id(p)] for p in items if id(p) in self._mnpar_of]
                if mapped:
                    out.append((comm, mapped))
        return out

    def shard_of(self, param: chainer.Parameter) -> chainer.Parameter:
        """The shard parameter of the model's ``param``."""
        return self._mnpar_of[id(param)]

    def shards_for(self, params: List[Any]) -> List[Any]:
        """The shards of those of ``params`` that are the model's; the others as they are
        (what ``GradientClipping``'s ``replicated`` lists stands for on the mirror)."""
        return [self._mnpar_of.get(id(p), p) for p in params]


def build_mirror(comm: Communicator, model: chainer.Link,
                 shards: Dict[str, Any]) -> Mirror:
    """The mirror of ``model`` whose parameter ``name`` holds ``shards[name]`` (an array)."""
    root = Mirror(comm, model)
    chains: Dict[str, chainer.Chain] = {"/": root}
    for path, _ in sorted(model.namedlinks(), key=lambda item: item[0].count("/")):
        if path == "/":
            continue
        parent, name = _owner_path(path)
        chain = chainer.Chain()
        chains[parent].add_link(name, chain)
        chains[path] = chain
    params = dict(model.namedparams())
    for name, array in shards.items():
        owner, attr = _owner_path(name)
        shard = chainer.Parameter(array)
        with chains[owner].init_scope():
            setattr(chains[owner], attr, shard)
        root._mnpar_of[id(params[name])] = shard
    return root


def attach(optimizer: chainer.Optimizer, mirror: Mirror, model: chainer.Link) -> None:
    """Makes ``mirror`` the target of the set-up ``optimizer`` without ``setup`` (which
    would drop its hooks, ``t`` and ``epoch``): an update rule for every shard, which
    the model's parameter of that name shares."""
    optimizer.target = mirror
    fp32 = getattr(optimizer, "_use_fp32_update", False)
    for _, param in model.namedparams():
        shard: Any = mirror.shard_of(param)
        if getattr(shard, "update_rule", None) is None:
            shard.update_rule = optimizer.create_update_rule()  # type: ignore[attr-defined]
            if fp32:
                shard.update_rule.use_fp32_update()
        param.update_rule = shard.update_rule


def check_no_shared(model: chainer.Link) -> None:
    """``ValueError`` if one parameter object sits at two paths of ``model`` (it would be
    sharded, reduced and updated twice)."""
    seen: Dict[int, str] = {}
    for name, p in sorted(model.namedparams()):
        if id(p) in seen:
            raise ValueError(f"sharded optimizer: the parameter {seen[id(p)]} is also "
                             f"{name}; a parameter shared by two links cannot be sharded "
                             "(tie the weights in the forward instead, or use stage 0)")
        seen[id(p)] = name
