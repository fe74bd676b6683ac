"""Scatter and gather over nested structures: a batch split across ranks.

``scatter_batch`` cuts every leaf of a nested structure (tuples, lists and
dicts of Variables or arrays) along axis 0, as ``numpy.array_split`` does,
and gives each rank its rows. ``gather_batch`` concatenates every rank's rows
on the root, except leaves under a key named in ``except_keys``, which stay
scattered for the next network (the DataParallel tutorial's idea)::

    root: x ──scatter_batch──▶ every rank: netA(x_i) ─┬─ 'feat' (stays here) ─▶ netB ─┐
                                                      └─ 'pred' ─gather_batch─▶ root   │
                                              root ◀──────────── gather_batch ─────────┘

Each leaf is one differentiable ``scatter`` or ``gather``. One leaf's
backward must not be left out on one rank while its peers wait in it, so the
results of one call are tied by a node (``_Tie``) that passes gradients
through and gives a missing one zeros: backward from any output of the call
runs every collective of the call, in the reverse of forward order.
"""
from typing import Any, Iterable, Iterator, List, Sequence, Tuple

import chainer
import chainer.functions as F

from .._arrays import get_array_module
from ..communicators._facade import Communicator
from ._collectives import gather, scatter
from ._placeholder import data_of

TreeDef = Any  # "leaf" | ("tuple" | "list", [defs]) | ("dict", [(key, def)])


def _flatten(data: Any, path: Tuple[Any, ...] = ()) -> Tuple[List[Tuple[tuple, Any]], TreeDef]:
    """The leaves of ``data`` with their key paths, and its shape as a tree."""
    if isinstance(data, dict):
        leaves, defs = [], []
        for k in data:
            sub, d = _flatten(data[k], path + (k,))
            leaves += sub
            defs.append((k, d))
        return leaves, ("dict", defs)
    if isinstance(data, (tuple, list)):
        leaves, items = [], []
        for i, x in enumerate(data):
            sub, d = _flatten(x, path + (i,))
            leaves += sub
            items.append(d)
        return leaves, (type(data).__name__, items)
    if not isinstance(data, chainer.Variable) and not hasattr(data, "shape"):
        where = "".join(f"[{k!r}]" for k in path) or "data"
        raise TypeError(f"{where} must be a Variable, an array, or a tuple, list or dict "
                        f"of them, not {type(data).__name__}")
    return [(path, data)], "leaf"


def _unflatten(tree: TreeDef, leaves: Iterator[Any]) -> Any:
    if tree == "leaf":
        return next(leaves)
    kind, items = tree
    if kind == "dict":
        return {k: _unflatten(d, leaves) for k, d in items}
    built = [_unflatten(d, leaves) for d in items]
    return tuple(built) if kind == "tuple" else built


class _Tie(chainer.FunctionNode):
    """Identity on every input; backward gives every input a gradient (zeros if none)."""

    def forward(self, inputs):
        self._specs = [(x.shape, x.dtype) for x in inputs]
        self._xp = get_array_module(inputs[0])
        return tuple(inputs)

    def backward(self, indexes, grad_outputs):
        return tuple(chainer.Variable(self._xp.zeros(*spec), requires_grad=False)
                     if g is None else g for g, spec in zip(grad_outputs, self._specs))


def _tie(xs: Sequence[Any]) -> Tuple[Any, ...]:
    if not chainer.config.enable_backprop or len(xs) < 2:
        return tuple(xs)
    return _Tie().apply(tuple(xs))


def _bounds(n: int, size: int) -> List[int]:
    """The split points of ``n`` rows over ``size`` ranks (``array_split``'s)."""
    return [i * (n // size) + min(i, n % size) for i in range(1, size)]


def scatter_batch(comm: Communicator, data: Any = None, root: int = 0) -> Any:
    """Splits every leaf of ``root``'s ``data`` along axis 0 over the ranks; collective.

    Args:
        comm: an mnpar communicator.
        data: on ``root``, a Variable or array, or a tuple, list or dict
            (nested) of them, each with a batch axis 0; ignored elsewhere.
        root: the rank that holds the batch.

    Returns:
        The same structure on every rank, each leaf a Variable of this rank's
        rows (``numpy.array_split``'s share: the first ``n % size`` ranks get
        one more). Backward gathers the rows' gradients back to ``root``.

    Raises:
        TypeError, ValueError: on every rank, if ``root``'s data has a leaf
            that is not a Variable or array, or one without a batch axis.

    Example::

        mine = mnpar.functions.scatter_batch(comm, {"x": x, "t": t} if comm.rank == 0
                                             else None)
    """
    leaves: List[Tuple[tuple, Any]] = []
    tree, error = None, None
    if comm.rank == root:
        try:
            leaves, tree = _flatten(data)
            for path, leaf in leaves:
                if len(leaf.shape) == 0:
                    raise ValueError(f"leaf {list(path)} is a scalar; scatter_batch splits "
                                     "along axis 0")
        except (TypeError, ValueError) as e:
            error = e
    error, tree = comm.bcast_obj((error, tree), root=root)
    if error is not None:
        raise error
    outs = []
    mine: List[Any] = [leaf for _, leaf in leaves] if comm.rank == root else [None] * _count(tree)
    for leaf in mine:
        if comm.rank == root:
            parts = F.split_axis(leaf, _bounds(leaf.shape[0], comm.size), 0, force_tuple=True)
            outs.append(scatter(comm, parts, root))
        else:
            outs.append(scatter(comm, None, root))
    return _unflatten(tree, iter(_tie(outs)))


def _count(tree: TreeDef) -> int:
    return 1 if tree == "leaf" else sum(_count(d[1] if tree[0] == "dict" else d)
                                        for d in tree[1])


def gather_batch(comm: Communicator, data: Any, root: int = 0,
                 except_keys: Iterable[Any] = ()) -> Any:
    """Concatenates every rank's leaves along axis 0 on ``root``; collective.

    Args:
        comm: an mnpar communicator.
        data: this rank's structure (a Variable or array, or a tuple, list or
            dict of them); every rank must pass the same structure.
        root: the rank that receives the batch.
        except_keys: dict keys whose leaves (at any depth below the key) are
            not gathered: they stay this rank's rows, on every rank.

    Returns:
        The same structure. On ``root`` a gathered leaf is the whole batch
        (ranks' rows in rank order); elsewhere it is an empty delegate
        variable, and backward from any one delegate (or from anything
        computed from a kept leaf) runs every gather of the call. Kept leaves
        are this rank's Variables.

    Raises:
        ValueError: on every rank, if the ranks' structures differ.
    """
    leaves, tree = _flatten(data)
    trees = comm.allgather_obj(tree)
    if any(t != trees[0] for t in trees):
        bad = next(r for r, t in enumerate(trees) if t != trees[0])
        raise ValueError(f"gather_batch needs the same structure on every rank; rank 0 has "
                         f"{trees[0]}, rank {bad} has {trees[bad]}")
    keep = set(except_keys)
    outs = []
    for path, leaf in leaves:
        if keep.intersection(k for k in path if not isinstance(k, int)):
            outs.append(leaf if isinstance(leaf, chainer.Variable)
                        else chainer.Variable(data_of(leaf)))
            continue
        ys = gather(comm, leaf, root)
        outs.append(F.concat(ys, axis=0) if comm.rank == root else ys)
    return _unflatten(tree, iter(_tie(outs)))

