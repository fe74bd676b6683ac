"""Exchanging the MultiNodeChainList wiring once, at the first forward.

Protocol, per communicator, on the private MPI duplicate and the reserved tag
``TAG_UB`` (the largest MPI tag, which mnpar's own messages never use):

1. At its first forward, a rank's model sends its program (``_wiring``) to
   every other rank, fire and forget. A rank whose whole traffic the model
   does not describe (several models, communicating links inside a
   component, plain ``send``/``recv`` used before) sends "unknown" instead.
2. It then waits until every rank's program is in, or ``GRACE_SECONDS`` pass
   (ranks that never use a MultiNodeChainList never send one), simulates the
   known programs and raises ``WiringError`` if a send or receive can never
   complete. Every rank that knows the same programs reaches the same verdict,
   so no further message is needed; only an error that the others cannot
   see (a rank's sends to itself) is reported to them.
3. For the rest of its first forward, whenever it waits for data it reads
   programs and reports that come late, and raises as soon as they show a
   mismatch. After that, nothing: later forwards cost nothing.

Programs never received (a rank that does not take part) stay queued on a tag
no receive of mnpar asks for, so they never disturb a later receive; the
transport counts them, and ``finalize()`` receives and drops every one still
due, even those still on their way, so that a later communicator with a
recycled MPI context never sees them.
"""
import os
import time
import weakref
from typing import Any, Dict, List, Optional

from .._errors import CommunicationTimeout, WiringError
from ._wiring import Op, report, simulate

GRACE_SECONDS = 1.0
ENV_SWITCH = "MNPAR_WIRING_CHECK"  # "0" turns the check off
_POLL_SECONDS = 200e-6

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
    if os.environ.get(ENV_SWITCH, "1") == "0" or not hasattr(comm, "_t"):
        return None
    exchange = _exchanges.get(comm)
    if exchange is None:
        exchange = _exchanges[comm] = Exchange(comm)
    return exchange


class Exchange:
    """One communicator's wiring exchange: programs received, reports, requests."""

    def __init__(self, comm: Any) -> None:
        transport = self.transport = comm._t
        self.mpi = transport.comm
        self.rank = comm.rank
        self.size = comm.size
        self.timeout = transport.timeout
        self.programs: Dict[int, Optional[List[Op]]] = {}
        self.notices: List[str] = []
        self.announced = False
        self._simulated = -1  # how many programs the last simulation saw

    def announce(self, ops: Optional[List[Op]]) -> None:
        """Sends this rank's program (None: unknown) to every other rank."""
        self.announced = True
        self.programs[self.rank] = ops
        body = None if ops is None else [tuple(op) for op in ops]
        self._post(("wiring", body))

    def fail(self, text: str) -> None:
        """Tells every other rank about a wiring error found here."""
        self._post(("error", text))

    def _post(self, payload: Any) -> None:
        for peer in range(self.size):
            if peer != self.rank:
                self.transport.post_control(payload, peer)

    def drain(self) -> bool:
        """Reads every program and report that has arrived; True if any did."""
        new = False
        while (message := self.transport.poll_control()) is not None:
            source, (kind, body) = message
            if kind == "wiring":
                self.programs[source] = None if body is None else [Op(*op) for op in body]
            else:
                self.notices.append(body)
            new = True
        return new

    def verify(self) -> None:
        """Raises WiringError if another rank reported one or the known programs jam."""
        if self.notices:
            raise WiringError(f"rank {self.rank}: another rank found a wiring error; "
                              f"{self.notices[0]}")
        if len(self.programs) == self._simulated:
            return
        self._simulated = len(self.programs)
        known = {r: ops for r, ops in sorted(self.programs.items()) if ops is not None}
        problems = simulate(known)
        if problems:
            raise WiringError(f"rank {self.rank}: {report(problems, known, self.size)}")

    def settle(self, grace: float) -> None:
        """Waits up to ``grace`` seconds for every rank's program, then verifies."""
        deadline = time.monotonic() + grace
        self.drain()
        while len(self.programs) < self.size and not self.notices \
                and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
            self.drain()
        self.verify()

    def await_message(self, peer: int, tag: int) -> None:
        """Waits until a message from ``peer`` is there, verifying news meanwhile."""
        start = time.monotonic()
        while not self.mpi.Iprobe(peer, tag):
            if self.drain() or self.notices:
                self.verify()
            elapsed = time.monotonic() - start
            if self.timeout is not None and elapsed > self.timeout:
                reached = ("has sent its wiring, so it reached its first forward"
                           if peer in self.programs else
                           "has not sent its wiring: it has not reached its first forward")
                raise CommunicationTimeout(
                    f"rank {self.rank}: MultiNodeChainList recv from rank {peer}, tag {tag} "
                    f"did not complete after {elapsed:.1f} s (timeout {self.timeout} s); "
                    f"waiting for the activations rank {peer} sends to this component; "
                    f"rank {peer} {reached}")
            time.sleep(_POLL_SECONDS)
