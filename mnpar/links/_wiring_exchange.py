"""Exchanging each MultiNodeChainList's wiring at its first forward.

Protocol, per communicator, on the private MPI duplicate and the transport's
control tag (MPI's largest tag, ``TAG_UB``; users' tags stop one below it):

1. At a model's first forward, its rank sends the model's program
   (``_wiring``), and whether that program shows all of the rank's traffic,
   to every other rank, fire and forget.
2. It then waits until every rank has announced at least once and every
   member of its model is in (``_wiring_match`` finds them among all the
   announcements), or ``GRACE_SECONDS`` pass (ranks that never use a
   MultiNodeChainList never announce), simulates the members' programs and
   raises ``WiringError`` if a send or receive can never complete. The
   members reach the same verdict from the same programs, so no further
   message is needed; only an error that the others cannot see (a rank's
   sends to itself) is reported to the model's members.
3. For the rest of that first forward, whenever it waits for data it reads
   announcements that come late, and raises as soon as they show a
   mismatch. After that, nothing: later forwards cost nothing.

Both waits poll through the communicator layer's ``probe``, so they pause,
and time out, like every other wait of mnpar.

A rank outside a model reads that model's announcements and finds they do not
talk with it; they never disturb a later receive, because they travel on a
tag no receive of mnpar asks for. The transport counts control messages, and
``finalize()`` receives and drops every one still due, even those still on
their way, so that a later communicator with a recycled MPI context never
sees them.
"""
import os
import weakref
from typing import Any, Dict, Iterable, List, Optional

from .._errors import CommunicationTimeout, PeerLost, WiringError
from ..communicators._facade import Communicator, probe
from ._wiring import Op, report
from ._wiring_match import Announcement, check, counterpart, gather

GRACE_SECONDS = 1.0
ENV_SWITCH = "MNPAR_WIRING_CHECK"  # "0" turns the check off

_models: "weakref.WeakKeyDictionary[Any, weakref.WeakSet]" = weakref.WeakKeyDictionary()
_exchanges: "weakref.WeakKeyDictionary[Any, Exchange]" = weakref.WeakKeyDictionary()


def register_model(comm: Any, model: Any) -> None:
    """Counts ``model`` among the MultiNodeChainLists on ``comm`` in this process."""
    try:
        _models.setdefault(comm, weakref.WeakSet()).add(model)
    except TypeError:  # a communicator that cannot be weakly referenced
        pass


def models_on(comm: Any) -> int:
    try:
        return len(_models.get(comm, ()))
    except TypeError:
        return 0


def exchange_for(comm: Any) -> Optional["Exchange"]:
    """The exchange of ``comm``; None if the check is off or ``comm`` is not mnpar's."""
    if os.environ.get(ENV_SWITCH, "1") == "0" or not isinstance(comm, Communicator):
        return None
    exchange = _exchanges.get(comm)
    if exchange is None:
        exchange = _exchanges[comm] = Exchange(comm)
    return exchange


class Exchange:
    """One communicator's wiring exchange: every rank's announcements, and reports."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.mpi = comm.private_comm
        self.rank = comm.rank
        self.size = comm.size
        self.timeout = comm.timeout
        self.history: Dict[int, List[Announcement]] = {r: [] for r in range(self.size)}
        self.notices: List[str] = []
        self._checked: Dict[int, int] = {}  # own index -> announcements seen by its last check

    def announce(self, ops: List[Op], partial: bool) -> int:
        """Sends one model's program to every other rank; returns its index here."""
        own = self.history[self.rank]
        own.append(Announcement(tuple(ops), partial))
        self._post(("wiring", ([tuple(op) for op in ops], partial)), range(self.size))
        return len(own) - 1

    def fail(self, index: int, text: str) -> None:
        """Tells the other members of model ``index`` about a wiring error found here."""
        self.drain()
        model = gather(self.history, (self.rank, index))
        ranks = {r for r, _ in model.members} | {peer for _, peer in model.pending}
        self._post(("error", text), ranks)

    def _post(self, payload: Any, ranks: Iterable[int]) -> None:
        for peer in ranks:
            if peer != self.rank:
                self.comm.post_control(payload, peer)

    def drain(self) -> bool:
        """Reads every announcement and report that has arrived; True if any did."""
        new = False
        while (message := self.comm.poll_control()) is not None:
            source, (kind, body) = message
            if kind == "wiring":
                ops, partial = body
                self.history[source].append(Announcement(tuple(Op(*op) for op in ops), partial))
            else:
                self.notices.append(body)
            new = True
        return new

    def verify(self, index: int) -> None:
        """Raises WiringError if another rank reported one or model ``index``'s programs jam."""
        if self.notices:  # raised once, so that a model built after it can still run
            raise WiringError(f"rank {self.rank}: another rank found a wiring error; "
                              f"{self.notices.pop(0)}")
        seen = sum(map(len, self.history.values()))
        if self._checked.get(index) == seen:
            return
        self._checked[index] = seen
        problems, programs = check(self.history, (self.rank, index))
        if problems:
            raise WiringError(f"rank {self.rank}: {report(problems, programs, self.size)}")

    def _settled(self, index: int) -> bool:
        if not all(self.history.values()):
            return False
        own = self.history[self.rank][index]
        return own.partial or not gather(self.history, (self.rank, index)).pending

    def settle(self, index: int, grace: float) -> None:
        """Waits up to ``grace`` seconds for model ``index``'s members, then verifies.

        Running out of grace is no error: some ranks never announce, and a
        late one is checked while the first forward waits for its data.
        """
        def ready() -> Any:  # probe's poll: anything but None ends the wait
            self.drain()
            return True if self.notices or self._settled(index) else None
        try:
            probe(ready, grace, self.comm.describe(
                "MultiNodeChainList wiring check", None, None, "the wiring of this model's ranks"))
        except PeerLost:
            raise
        except CommunicationTimeout:
            pass
        self.verify(index)

    def await_message(self, index: int, peer: int, tag: int) -> None:
        """Waits (up to the timeout) until a message from ``peer`` is there, verifying news."""
        def ready() -> Any:
            if self.mpi.Iprobe(peer, tag):
                return True
            if self.drain() or self.notices:
                self.verify(index)
            return None

        def what() -> str:
            reached = ("has sent this model's wiring, so it reached the model's first "
                       "forward" if counterpart(self.history, (self.rank, index), peer)
                       is not None else "has not sent this model's wiring: it has not "
                       "reached the model's first forward")
            return (f"the activations rank {peer} sends to this component; rank {peer} "
                    f"{reached}")
        probe(ready, self.timeout, self.comm.describe(
            f"MultiNodeChainList recv from rank {peer}, tag {tag}", None, None, what,
            watch=peer))
