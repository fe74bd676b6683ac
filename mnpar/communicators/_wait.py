"""Waiting on MPI requests: with a timeout, and without burning a core.

Every blocking wait in mnpar goes through ``wait``, in three phases:

=========  ===========  ===================================================
phase      until        why
=========  ===========  ===================================================
quick      32 tests     a tight loop of ``Test`` alone (``settled``): most
                        small messages land within it, and a clock read
                        per poll would add a fraction of a microsecond to
                        each of them
spin       1 ms         a message usually lands within microseconds, and a
                        rank polling its own core slows no other rank
sleep      the timeout  exponential back-off from 50 us to 1 ms: a long
                        wait costs a few percent of a core, not all of it
=========  ===========  ===================================================

MPI moves data only inside MPI calls, so a wait for a transfer known to be
``n`` bytes long spins for ``n / SPIN_BANDWIDTH`` seconds more: sleeping
while a 16 MB message is half copied would stall the copy itself (0.1 GB/s
once the job spans hosts, ``across_hosts``: over TCP it is the polls that
move the data). The wait for the next message from a peer whose last one
was ``n`` bytes long spins as long (``likely``, the transport's
``_arrive``): that peer is likely still busy with such data, and sleeps
between polls overshot the arrival of large messages
(docs/benchmarks_history.rst, "the receive pool and the size-aware wait").
A spin longer than ``SPIN_SECONDS`` checks the peers once a second too, so
a lost host or a finished peer is never found later for a long spin.

(``sched_yield`` between polls was tried: on virtual machines one call can
take longer than a small message, and that lands on every message's latency;
docs/benchmarks_history.rst, "Figures behind choices in the code".)
Past the deadline it cancels what it can and raises
``CommunicationTimeout`` with a description of who waited for what. While
it sleeps it also asks, once a second, whether some rank's heartbeat has
stopped (``PeerLost``, a ``CommunicationTimeout``: ``_liveness``) and
whether the peer it waits on has finished with the communicator
(``PeerFinished``: ``_ending``; the description, a ``_waiting.Waiting``, knows whom it
waits on). A finished peer's message that is already on its way gets a
little more time (``FINISH_GRACE``, longer for more bytes) before the wait
gives up.
"""
import time
from typing import Any, Callable, List, Optional

from mpi4py import MPI

from .._errors import CommunicationError, CommunicationTimeout, PeerFinished
from . import _liveness as liveness

QUICK_TESTS = 32  # tests before the first clock read: a message due within microseconds
SPIN_SECONDS = 1e-3
SPIN_BANDWIDTH_NODE = 1e9  # bytes/s: a transfer inside a host slower than this may sleep
SPIN_BANDWIDTH = SPIN_BANDWIDTH_NODE  # what waits use now
NETWORK_SPIN_BANDWIDTH = 1e8  # the same once the job spans hosts (``across_hosts``)
MIN_SLEEP = 50e-6
MAX_SLEEP = 1e-3
CHECK_EVERY = 1.0  # seconds between two checks of a sleeping wait's peers
FINISH_GRACE = 1.0  # seconds a message on its way gets once its sender has finished


class Poller:
    """The pause between two polls, shared by request waits and matched probes.

    ``pause`` returns at once while the wait is young (longer for more bytes),
    then sleeps, twice as long each time up to ``MAX_SLEEP``, and raises
    ``CommunicationTimeout`` once ``timeout`` has passed. While it sleeps it
    checks the peers once a second (``_check``).
    """

    __slots__ = ("start", "sleep", "spin", "grace", "next_check", "finished")

    def __init__(self, nbytes: int = 0, likely: int = 0) -> None:
        self.start = time.monotonic()
        self.sleep = 0.0
        # What the transfer may still take once its peer has finished: only the bytes
        # known to be on their way (``nbytes``), not those ``likely`` to come.
        self.grace = SPIN_SECONDS + nbytes / SPIN_BANDWIDTH
        self.spin = self.grace + likely / SPIN_BANDWIDTH
        self.next_check = 0.0
        self.finished: Optional[str] = None  # the PeerFinished text, once seen

    def pause(self, timeout: Optional[float], describe: Callable[[float], str]) -> None:
        now = time.monotonic()
        elapsed = now - self.start
        if timeout is not None and elapsed > timeout:
            raise CommunicationTimeout(describe(elapsed))
        if elapsed < self.spin:
            if elapsed >= SPIN_SECONDS and now >= self.next_check:
                self._check(now, describe)  # a long spin, once a second
            return
        if now >= self.next_check:
            self._check(now, describe)
        self.sleep = min(MAX_SLEEP, max(MIN_SLEEP, self.sleep * 2))
        time.sleep(self.sleep)

    def _check(self, now: float, describe: Callable[[float], str]) -> None:
        """Raises ``PeerLost`` for a lost host, or ``PeerFinished`` once the peer waited
        on has been seen finished for the grace (the caller's request was tested since)."""
        self.next_check = now + CHECK_EVERY
        liveness.check()
        if self.finished is not None:
            raise PeerFinished(self.finished)
        finished = getattr(describe, "finished", None)
        found = finished() if finished is not None else None
        if found is not None:
            self.finished, grace = found
            self.next_check = now + max(FINISH_GRACE, self.grace, grace)


def across_hosts() -> None:
    """The job spans hosts: from now on waits spin as if data moved at 0.1 GB/s.

    Over TCP, MPI moves data only while a rank polls, and a wait that slept
    between polls throttled it: ``naive``'s per-parameter allreduces on test
    hosts took several times MPI's own (docs/scaling.rst, "Spinning across
    hosts"). On a cluster a rank has its core to itself, so spinning longer
    while data is due costs nothing else.
    """
    global SPIN_BANDWIDTH
    SPIN_BANDWIDTH = NETWORK_SPIN_BANDWIDTH


def settled(requests: List[MPI.Request], status: Optional[MPI.Status] = None) -> bool:
    """Whether every request completes within ``QUICK_TESTS`` tests: the quick phase.

    Hot paths call it before they build the text ``wait`` needs (a closure and
    an f-string, whose cost docs/benchmarks_history.rst gives), so a message
    that lands within the quick phase never pays for it.
    """
    if len(requests) == 1:
        test = requests[0].Test
        for _ in range(QUICK_TESTS):
            if test(status):
                return True
        return False
    testall = MPI.Request.Testall
    for _ in range(QUICK_TESTS):
        if testall(requests):
            return True
    return False


def wait(requests: List[MPI.Request], timeout: Optional[float],
         describe: Callable[[float], str], status: Optional[MPI.Status] = None,
         nbytes: int = 0) -> None:
    """Waits for every request; on timeout cancels them and raises.

    ``describe(elapsed)`` builds the timeout message only when it is needed.
    ``status`` (with one request) receives that request's status. ``nbytes``
    is how much data the requests move, which lengthens the spin (and a
    finished peer's grace); ``keep_waiting``'s ``likely``, how much its peer is
    likely busy with first, lengthens the spin alone.
    """
    if not settled(requests, status):
        keep_waiting(requests, timeout, describe, status, nbytes)


def keep_waiting(requests: List[MPI.Request], timeout: Optional[float],
                 describe: Callable[[float], str], status: Optional[MPI.Status] = None,
                 nbytes: int = 0, likely: int = 0) -> None:
    """``wait`` past its quick phase, for a caller that ran ``settled`` itself."""
    poller = Poller(nbytes, likely)
    if len(requests) == 1:
        req = requests[0]
        while not req.Test(status):
            _pause_or_cancel(poller, requests, timeout, describe)
        return
    while not MPI.Request.Testall(requests):
        _pause_or_cancel(poller, requests, timeout, describe)


def _pause_or_cancel(poller: Poller, requests: List[MPI.Request], timeout: Optional[float],
                     describe: Callable[[float], str]) -> None:
    try:
        poller.pause(timeout, describe)
    except CommunicationError:
        for req in requests:
            if req != MPI.REQUEST_NULL:
                try:
                    req.Cancel()
                except MPI.Exception:
                    pass  # collectives cannot be cancelled; the job ends anyway
        raise


def probe(improbe: Callable[[], Any], timeout: Optional[float],
          describe: Callable[[float], str]) -> Any:
    """A matched probe that honours the timeout (``Mprobe`` cannot): polls ``improbe``
    until it returns something other than None, and returns that.

    ``improbe`` is ``comm.Improbe`` (buffers) or ``comm.improbe`` (pickled
    objects) bound to its source, tag and status.
    """
    msg = improbe()
    if msg is not None:
        return msg
    poller = Poller()
    while True:
        poller.pause(timeout, describe)
        msg = improbe()
        if msg is not None:
            return msg
