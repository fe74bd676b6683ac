"""Gradient clipping by the norm of the whole model, wherever its pieces are.

chainer's ``GradientClipping`` scales the gradients by ``threshold / norm``
where ``norm`` is taken over the optimizer's own parameters. On a model split
over ranks each rank then clips by the norm of its own piece, a different
factor on every rank, and the update is not the one of the whole model. Here
the squares are summed over the ranks with one 8-byte allreduce per update,
and a parameter that several ranks hold with equal gradients counts once::

    rank 0: piece A              |A|^2 ┐
    rank 1: piece B, replica R   |B|^2 + |R|^2 / 2  ├─ allreduce: |A|^2 + |B|^2 + |C|^2 + |R|^2
    rank 2: piece C, replica R   |C|^2 + |R|^2 / 2  ┘

A parameter is counted ``1 / size`` times on each rank of every
communicator it is declared replicated over (weights multiply). It is
declared so by the hook's ``replicated`` argument, or by a link of the model
itself: a link with a method ``mnpar_replicas()`` that returns
``(communicator, parameters)`` pairs (spatial layers whose parameters are
summed over the grid). Parameters without a gradient take no part.

A parameter sharded over a communicator (sharded data parallelism: each
rank of the data axis holds a disjoint piece, ``mnpar_shards()`` of the
optimizer's target, the mirror of shards) counts once over its pieces::

    data axis D, shards s0 | s1      hook's comm C
    D inside C  (C = D, or C = world)   |s_r|^2 joins the one allreduce over C
    D apart from C (they meet in this   |s0|^2 + |s1|^2 summed over D first (8 bytes), then
      rank only: C = a model's pieces)  added to the allreduce over C, alike on every rank of D
    D partly in C                       refused: no sum counts each piece once

A replica declaration over D itself does not apply to shards over D (they
differ there); one over another communicator carries over to the shards.

chainer's own hook on a rank that holds a piece of a model (a link whose
``mnpar_piece`` is true: a MultiNodeChainList that talks to other ranks, a
pipeline stage, MultiNodeNStepRNN) warns once, at its first update
(``warn_on_pieces``).
"""
import math
import warnings
import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import chainer
import chainer.optimizer_hooks
import numpy as np
from mpi4py import MPI

from ..communicators._facade import Communicator, require_communicator, wait


class ClippingWarning(UserWarning):
    """chainer's own gradient clipping on a rank that holds a piece of a split model."""


def _params_of(what: Any) -> List[Any]:
    """The parameters of a link, or the parameters listed."""
    if isinstance(what, chainer.Link):
        return list(what.params())
    return list(what)


def _check_replicated(replicated: Iterable[Any]) -> List[Tuple[Communicator, Any]]:
    pairs = []
    for i, pair in enumerate(replicated):
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise TypeError(f"replicated[{i}] must be a (communicator, link or parameters) "
                            f"pair, not {type(pair).__name__}")
        require_communicator(pair[0], f"GradientClipping's replicated[{i}]")
        if not isinstance(pair[1], chainer.Link):
            items = list(pair[1])
            bad = [type(p).__name__ for p in items if not isinstance(p, chainer.Parameter)]
            if bad:
                raise TypeError(f"replicated[{i}] lists a {bad[0]}; give a chainer.Link or "
                                "chainer.Parameter objects")
            pair = (pair[0], items)
        pairs.append(pair)
    return pairs


class GradientClipping:
    """Scales every rank's gradients so that the whole model's norm is at most ``threshold``.

    The same as ``chainer.optimizer_hooks.GradientClipping`` on the whole
    model in one process, for a model whose pieces live on the ranks of
    ``comm`` (a MultiNodeChainList, pipeline stages, tile-sharded weights).
    Every rank of ``comm`` adds it to its optimizer; each update is then
    collective over ``comm``.

    Args:
        comm: the communicator of the ranks that hold one model's pieces.
            Data-parallel copies of the model on other ranks need not take
            part: after the gradients are averaged each copy computes the
            same norm.
        threshold: the largest norm allowed.
        replicated: ``(communicator, link or parameters)`` pairs: parameters
            whose gradients are equal on every rank of ``communicator`` (a
            group of ``comm``'s ranks) when the optimizer updates, such as
            data-parallel copies after averaging, when ``comm`` spans them.
            Each counts once. Links of the model declare their own with a
            ``mnpar_replicas()`` method returning such pairs.

    Attributes:
        norm: the whole model's gradient norm at the last update (None before).

    Raises:
        TypeError: ``comm`` or a ``replicated`` entry is not what it must be.
        ValueError: ``threshold`` is not a positive number.

    Example::

        optimizer = chainer.optimizers.SGD().setup(model)   # this rank's piece
        optimizer.add_hook(mnpar.optimizer_hooks.GradientClipping(comm, 5.0))
    """

    name = "GradientClipping"
    timing = "pre"
    mnpar_shard_aware = True  # sharded optimizers may run it: it sums squares over shards

    def __init__(self, comm: Communicator, threshold: float,
                 replicated: Iterable[Tuple[Communicator, Any]] = ()) -> None:
        require_communicator(comm, "GradientClipping")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise TypeError(f"threshold must be a number, not {type(threshold).__name__}")
        if not threshold > 0:
            raise ValueError(f"threshold={threshold} must be a positive number")
        self.comm = comm
        self.threshold = float(threshold)
        self.replicated = _check_replicated(replicated)
        self.norm: Optional[float] = None
        self._relations: Dict[Tuple[int, int], str] = {}  # (id(shard comm), id(comm)) -> ...

    def weights(self, target: chainer.Link) -> Dict[int, float]:
        """How much each replicated parameter's square counts on this rank, by ``id``."""
        groups = list(self.replicated)
        for link in target.links():
            declare = getattr(link, "mnpar_replicas", None)
            if callable(declare):
                groups.extend(declare())
        shard_of = getattr(target, "shards_for", None)  # a mirror: model params -> their shards
        over = [comm for comm, _ in shards_of(target)]
        weights: Dict[int, float] = {}
        seen = set()
        for comm, params in groups:
            items = _params_of(params)
            if callable(shard_of):
                if any(relation(comm, d) == "inside" for d in over):
                    continue  # shards over the data axis are no replicas there
                items = shard_of(items)
            for p in items:
                if (id(p), id(comm)) not in seen:
                    seen.add((id(p), id(comm)))
                    weights[id(p)] = weights.get(id(p), 1.0) / comm.size
        return weights

    def __call__(self, opt: Any) -> None:
        params = [p for p in opt.target.params(False) if p.grad is not None]
        weights = self.weights(opt.target)
        sharded: Dict[int, int] = {}
        groups = shards_of(opt.target)
        for i, (_, pieces) in enumerate(groups):
            for p in pieces:
                sharded.setdefault(id(p), i)
        plain = [p for p in params if id(p) not in sharded]
        total = _sum_of_squares([p.grad for p in plain], [weights.get(id(p), 1.0) for p in plain])
        for i, (comm, _) in enumerate(groups):
            mine = [p for p in params if sharded.get(id(p)) == i]
            part = _sum_of_squares([p.grad for p in mine], [weights.get(id(p), 1.0) for p in mine])
            how = self._relation(comm)
            if how == "apart":
                part = self._sum_over(comm, part, "every rank's sum of squared gradient shards")
            elif how == "mixed":
                raise ValueError(
                    f"GradientClipping: parameters are sharded over a communicator of "
                    f"{comm.size} ranks that only partly overlaps the hook's ({self.comm.size} "
                    "ranks); give the hook a communicator that holds the data axis or meets "
                    "it in this rank alone")
            total += part
        norm = self.norm = math.sqrt(self._sum_over(self.comm, total,
                                                    "every rank's sum of squared gradients"))
        if not norm > self.threshold:
            return
        rate = self.threshold / norm
        for p in params:
            with chainer.using_device(p.device):
                p.grad *= rate


    def _relation(self, shards: Communicator) -> str:
        """``relation(shards, self.comm)``, agreed on by every rank of ``shards`` the first
        time (ranks that see it differently all see ``'mixed'``), so all refuse together."""
        key = (id(shards), id(self.comm))
        if key not in self._relations:
            codes = ("inside", "apart", "mixed")
            mine = codes.index(relation(shards, self.comm))
            both = np.array([mine, -mine], np.int64)
            wait([shards.private_comm.Iallreduce(MPI.IN_PLACE, both, MPI.MAX)], shards.timeout,
                 shards.describe("GradientClipping", None, None,
                                 "every rank of the shards' communicator"))
            self._relations[key] = codes[mine] if both[0] == -both[1] else "mixed"
        return self._relations[key]

    @staticmethod
    def _sum_over(comm: Communicator, value: float, what: str) -> float:
        """``value`` summed over ``comm``'s ranks (one 8-byte allreduce)."""
        buf = np.array([value])
        wait([comm.private_comm.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM)], comm.timeout,
             comm.describe("GradientClipping", None, None, what))
        return float(buf[0])


def shards_of(target: chainer.Link) -> List[Tuple[Communicator, List[Any]]]:
    """The ``(communicator, parameters)`` pairs of parameters sharded over a communicator
    that the links of ``target`` declare (``mnpar_shards()``)."""
    out: List[Tuple[Communicator, List[Any]]] = []
    for link in target.links():
        declare = getattr(link, "mnpar_shards", None)
        if callable(declare):
            out.extend((comm, list(params)) for comm, params in declare())
    return out


def relation(a: Communicator, b: Communicator) -> str:
    """``'inside'`` if every rank of ``a`` is in ``b``; ``'apart'`` if they share this rank
    alone; ``'mixed'`` otherwise. Local: MPI groups, no message."""
    if a is b:
        return "inside"
    ga, gb = a.private_comm.Get_group(), b.private_comm.Get_group()
    try:
        found = MPI.Group.Translate_ranks(ga, list(range(ga.Get_size())), gb)
    finally:
        ga.Free()
        gb.Free()
    shared = sum(r != MPI.UNDEFINED for r in found)
    if shared == len(found):
        return "inside"
    return "apart" if shared == 1 else "mixed"


def _sum_of_squares(grads: Sequence[Any], weights: Sequence[float]) -> float:
    """Σ weight·|grad|², in float64; one device-to-host copy for GPU gradients."""
    total: Any = 0.0
    for g, w in zip(grads, weights):
        flat = g.ravel()
        if flat.dtype == np.float16:  # its squares overflow: summed in float32
            flat = flat.astype(np.float32)
        square = flat.dot(flat).astype(np.float64)
        total = total + (square if w == 1.0 else square * w)
    return float(total)


# -- chainer's own hook on a piece ------------------------------------------------

_checked: "weakref.WeakSet[Any]" = weakref.WeakSet()  # chainer hooks seen at an update


def pieces_in(target: chainer.Link) -> List[str]:
    """The links of ``target`` that hold a piece of a model split over ranks."""
    return [f"{name or '/'} ({type(link).__name__})" for name, link in target.namedlinks()
            if getattr(link, "mnpar_piece", False)]


def _warn_once(hook: Any, opt: Any) -> None:
    if hook in _checked:
        return
    _checked.add(hook)
    pieces = pieces_in(opt.target)
    if pieces:
        warnings.warn(
            f"chainer.optimizer_hooks.GradientClipping clips by this rank's own gradient "
            f"norm, but its optimizer's model holds a piece of a model split over ranks "
            f"({', '.join(pieces[:3])}): every rank clips by another factor, and the update "
            f"is not the whole model's. Use mnpar.optimizer_hooks.GradientClipping(comm, "
            f"{hook.threshold!r}), which clips by the norm of the whole model",
            ClippingWarning, stacklevel=4)


def warn_on_pieces() -> None:
    """Makes chainer's ``GradientClipping`` warn once, at its first update, where its
    optimizer's model holds a piece of a split model (``mnpar_piece``); idempotent."""
    cls = chainer.optimizer_hooks.GradientClipping
    if getattr(cls.__call__, "_mnpar_warns", False):
        return
    call = cls.__call__

    def __call__(self: Any, opt: Any) -> None:
        _warn_once(self, opt)
        call(self, opt)

    __call__._mnpar_warns = True  # type: ignore[attr-defined]
    __call__.__doc__ = call.__doc__
    cls.__call__ = __call__  # type: ignore[method-assign]
