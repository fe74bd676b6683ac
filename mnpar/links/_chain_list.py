"""MultiNodeChainList: one rank's part of a model split over ranks.

Each component receives its inputs (the model's own, or from ``rank_in``),
runs, and sends its outputs (to ``rank_out``, or as the model's output).
Every send and receive of a forward takes the delegate of the one before as
an input, so the rank's communications form one chain in the graph::

    recv(1) ── d1 ──> send(2) ── d2 ──> recv(2) ── d3 ...
     |                  ^                 |
     v                  |                 v
    component 0 ────────┘                component 1

and chainer's backward, which runs the highest node first, replays them in
exactly the reverse order. The model's output (from whichever component has
``rank_out=None``) is joined to the last delegate with ``pseudo_connect``, so
one ``backward()`` from the loss walks the whole chain; a rank without an
output returns the last delegate to call ``backward()`` on.
"""
import numbers
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import chainer
from chainer.utils.type_check import InvalidType

from .._errors import WiringError
from ..communicators._facade import Communicator, note_progress, require_communicator
from ..functions._point_to_point import PLAIN_USERS, recv_chained, send_chained
from ..functions._pseudo_connect import pseudo_connect
from . import _wiring_exchange as exchange_mod
from ._wiring import Ranks, Wire, Wiring, check_self_sends, program
from ._wiring_cut import cut_error, received_arrays


class MultiNodeChainList(chainer.ChainList):
    """A chain of components, each receiving from and sending to other ranks.

    Components run in the order they were added; backward runs them in
    reverse, from one ``backward()`` call on the model's output (or, on a
    rank without one, on the returned delegate variable).

    On the first forward the ranks taking part in this model exchange their
    wiring and check that every send meets a receive in an order that cannot
    deadlock; a mismatch raises ``mnpar.WiringError`` naming the send or
    receive, instead of a hang. Several models may share a communicator, each
    on any subset of its ranks; a rank outside a model is not disturbed by
    it. A rank whose traffic this model does not fully describe (several live
    models on that rank, communicating links such as MultiNodeNStepRNN inside
    a component, ``mnpar.functions.send``/``recv`` called before) is left out
    of the simulation; ``MNPAR_WIRING_CHECK=0`` turns the check off. In the
    first forward, a component that chainer's type check finds unable to take
    what came through a cut (a float64 piece sending to a float32 one, a shape
    beyond the batch axis that its first layer does not take) raises a
    ``WiringError`` naming both ranks, the component and the two dtypes (or
    the shape), and the model's ranks still in their first forward raise it too
    (``_wiring_cut``).

    Args:
        comm: an mnpar communicator.

    Example::

        class MLP0(mnpar.MultiNodeChainList):          # rank 0
            def __init__(self, comm):
                super().__init__(comm=comm)
                self.add_link(MLP0SubA(), rank_in=None, rank_out=1)
                self.add_link(MLP0SubB(), rank_in=1, rank_out=None)

        class MLP1(mnpar.MultiNodeChainList):          # rank 1
            def __init__(self, comm):
                super().__init__(comm=comm)
                self.add_link(MLP1Sub(), rank_in=0, rank_out=0)
    """

    _mnpar_communicates = True  # makes an enclosing model's wiring unknown

    def __init__(self, comm: Communicator) -> None:
        require_communicator(comm, "MultiNodeChainList")
        super().__init__()
        self._comm = comm
        self._wires: List[Wire] = []
        self._wiring_checked = False
        self._forwards = 0  # where this rank is, for a peer that waits on it (_ending)
        self._announced: Optional[Tuple[Any, int]] = None  # (exchange, index) once announced
        exchange_mod.register_model(comm, self)

    def add_link(self, link: Any, rank_in: Any = None, rank_out: Any = None) -> None:
        """Adds a component that receives from ``rank_in`` and sends to ``rank_out``.

        Args:
            link (chainer.Link): the component.
            rank_in: None (take the model's inputs), a rank or a list of
                ranks; the data received from each is passed positionally, in
                list order. This rank's own rank takes what an earlier
                component sent to it.
            rank_out: None (the component's outputs are the model's output;
                one component at most), a rank or a list of ranks, each sent
                the outputs (a tuple travels as a tuple).

        Raises:
            TypeError: ``link`` is not a ``chainer.Link``, or a rank is not an int.
            ValueError: a rank is out of range, a list is empty, or a second
                component has ``rank_out=None``.
        """
        if not isinstance(link, chainer.Link):
            raise TypeError(f"add_link needs a chainer.Link, not {type(link).__name__} "
                            f"{link!r}")
        ins = self._ranks(rank_in, "rank_in")
        outs = self._ranks(rank_out, "rank_out")
        if outs is None:
            for i, (_, other) in enumerate(self._wires):
                if other is None:
                    raise ValueError(
                        f"component {i} already has rank_out=None (the model's output); a "
                        "MultiNodeChainList has at most one component with rank_out=None")
        super().add_link(link)
        self._wires.append(Wire(ins, outs))
        for peer in {*(ins or ()), *(outs or ())} - {self._comm.rank}:  # data and gradients
            self._comm.name_sender(peer, 0, "a MultiNodeChainList")

    @property
    def wiring(self) -> Wiring:
        """This rank's wiring: one ``Wire(rank_in, rank_out)`` per component, in order.

        Each is None (the model's inputs or output) or a tuple of ranks, as
        ``add_link`` normalised it. A tuple of NamedTuples, so read-only:
        ``add_link`` is the one way to change the wiring the ranks check and run.

        Example::

            m.add_link(A, rank_in=None, rank_out=1)
            m.wiring              # (Wire(rank_in=None, rank_out=(1,)),)
            m.wiring[0].rank_out  # (1,)
        """
        return tuple(self._wires)

    @property
    def mnpar_piece(self) -> bool:
        """Whether this rank holds a piece of a model whose other pieces are on other
        ranks (a component receives from or sends to another rank): chainer's own
        ``GradientClipping`` then warns (``mnpar.optimizer_hooks``)."""
        me = self._comm.rank
        return any(r != me for wire in self._wires for ranks in wire if ranks is not None
                   for r in ranks)

    @property
    def mnpar_split(self) -> Dict[str, Any]:
        """How this rank's piece of the model is cut, as plain data (JSON): its wiring
        and, for ``build_stage``'s stages, the cut. A snapshot records it
        (``mnpar.extensions``), so that one written under another split is refused."""
        split: Dict[str, Any] = {"wiring": [[None if r is None else list(r) for r in wire]
                                            for wire in self._wires]}
        stage = getattr(self, "_mnpar_stage", None)
        if stage is not None:
            balance, chunks, loop, model = stage
            split["build_stage"] = {"balance": list(balance), "chunks": chunks, "loop": loop,
                                    "placement": getattr(self, "_mnpar_placement", None),
                                    "model": model}
        return split

    def _ranks(self, ranks: Any, name: str) -> Ranks:
        if ranks is None:
            return None
        items = list(ranks) if isinstance(ranks, (list, tuple)) else [ranks]
        if not items:
            raise ValueError(f"{name}={ranks!r} is empty; use None for no rank")
        size = self._comm.size
        for r in items:
            if not isinstance(r, numbers.Integral) or isinstance(r, bool):
                raise TypeError(f"{name} must be None, an int rank or a list of them; got "
                                f"{type(r).__name__} {r!r} in {name}={ranks!r}")
            if not 0 <= int(r) < size:
                raise ValueError(f"{name}={ranks!r}: rank {r} is out of range for a "
                                 f"communicator of size {size}")
        return tuple(int(r) for r in items)

    def forward(self, *inputs: Any) -> Any:
        self._forwards += 1
        note_progress("forward pass {} of its MultiNodeChainList", self._forwards)
        first = not self._wiring_checked
        waiter = self._check_wiring() if first else None
        run = _Forward(self._comm, inputs, waiter)
        for i, (link, (rank_in, rank_out)) in enumerate(zip(self._children, self._wires)):
            xs = run.receive(rank_in)
            ys = self._first_call(i, link, xs, rank_in) if first else link(*xs)
            run.send(ys, rank_out)
        self._wiring_checked = True
        return run.result()

    def _first_call(self, i: int, link: Any, xs: Tuple[Any, ...], rank_in: Ranks) -> Any:
        """Component ``i`` on ``xs``; chainer's type check failing on what came through a
        cut is a WiringError, here and (through the exchange) on the model's other ranks."""
        try:
            return link(*xs)
        except InvalidType as e:
            rank = self._comm.rank
            error = cut_error(rank, i, link, received_arrays(rank, rank_in, xs), e)
            if error is None:
                raise
            if self._announced is not None:
                exchange, index = self._announced
                exchange.fail(index, str(error))
            raise error from e

    # -- the wiring check, once ----------------------------------------------

    def _check_wiring(self) -> Optional[Callable[[int], None]]:
        """Checks this rank's wiring, then the model's on all its ranks; returns a receive hook."""
        rank = self._comm.rank
        exchange = exchange_mod.exchange_for(self._comm)
        if exchange is None:
            check_self_sends(rank, self._wires)
            return None
        index = exchange.announce(program(rank, self._wires), not self._knowable())
        self._announced = (exchange, index)
        try:
            check_self_sends(rank, self._wires)
        except WiringError as e:
            exchange.fail(index, str(e))
            raise
        exchange.settle(index, exchange_mod.GRACE_SECONDS)
        return lambda peer: exchange.await_message(index, peer, 0)

    def _knowable(self) -> bool:
        """Whether this model alone makes all of this rank's traffic on its communicator."""
        if exchange_mod.models_on(self._comm) != 1 or self._comm in PLAIN_USERS:
            return False
        return not any(getattr(link, "_mnpar_communicates", False)
                       for child in self._children for link in child.links())


class _Forward:
    """One forward pass: the delegate chain, the queue of self-sends, the output."""

    def __init__(self, comm: Communicator, inputs: Tuple[Any, ...],
                 waiter: Optional[Callable[[int], None]]) -> None:
        self.comm = comm
        self.rank = comm.rank
        self.inputs = inputs
        self.waiter = waiter
        self.delegate: Optional[chainer.Variable] = None
        self.own: Deque[Any] = deque()
        self.output: Any = None
        self.has_output = False

    def receive(self, rank_in: Ranks) -> Tuple[Any, ...]:
        """The component's arguments: the model's inputs, or one per rank of ``rank_in``."""
        if rank_in is None:
            return self.inputs
        xs = []
        for r in rank_in:
            if r == self.rank:
                xs.append(self.own.popleft())
                continue
            if self.waiter is not None:
                self.waiter(r)
            x, self.delegate = recv_chained(self.comm, r, self.delegate)
            xs.append(x)
        return tuple(xs)

    def send(self, ys: Any, rank_out: Ranks) -> None:
        """Sends the component's outputs to each rank of ``rank_out``, or keeps them."""
        if rank_out is None:
            self.output, self.has_output = ys, True
            return
        for r in rank_out:
            if r == self.rank:
                self.own.append(ys)
            else:
                self.delegate = send_chained(ys, self.comm, r, self.delegate)

    def result(self) -> Any:
        """The model's output joined to the last delegate, or that delegate."""
        if not self.has_output:
            return self.delegate
        y = self.output
        if self.delegate is None or _made_by(y, self.delegate):
            return y
        if isinstance(y, (tuple, list)):
            return type(y)(pseudo_connect(self.delegate, *y))
        return pseudo_connect(self.delegate, y)[0]


def _made_by(y: Any, delegate: chainer.Variable) -> bool:
    """True if ``y`` is an output of the node that made ``delegate`` (no join needed)."""
    return isinstance(y, chainer.Variable) and y.creator_node is delegate.creator_node
