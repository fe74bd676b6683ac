"""Liveness: every rank hears from every other rank every few seconds.

A rank that dies ends the job at once: the launcher sees its process go.
A host cut off from the network does not: its ranks' messages simply stop
coming, and a wait for them lasts until the operation timeout (600 s by
default). So each rank runs a small thread that, on a duplicate communicator
of its own, sends one byte to every other rank every ``PERIOD`` seconds
(``MNPAR_HEARTBEAT``; 0 turns it off) and notes when it last heard from
each. A wait that has begun to sleep (``_wait.Poller``) asks about once a
second whether some rank has been silent for ``LOST_AFTER`` seconds
(``MNPAR_LOST_AFTER``, default 20) and raises ``PeerLost``, naming the
silent ranks, their hosts and the hosts' other ranks. If the main thread is
inside an MPI call that never sleeps in mnpar's wait (an object collective)
and stays there another ``LOST_AFTER`` seconds, the thread writes the same
message and ends the process, so that no rank outlives a lost host.

A rank that ends normally says goodbye first (a message of its own), so its
silence afterwards is not taken for a loss. The thread needs MPI's
``THREAD_MULTIPLE`` (mpi4py asks for it by default); without it liveness is
off. Hosts are named by ``MPI.Get_processor_name()``, or by
``MNPAR_HOST_NAME`` where that is set (test hosts in network namespaces share
the machine's name). It is started once per process, by the first communicator made over
``MPI.COMM_WORLD`` (``start``), and stopped at exit (``stop``, called by ``_ending``
once every communicator has ended, so that a rank waiting at exit for the
others keeps beating).
"""
import contextlib
import os
import sys
import threading
import time
from typing import Dict, Iterator, List, Optional

from mpi4py import MPI

from .. import _failfast as failfast
from .._errors import PeerLost

PERIOD_ENV = "MNPAR_HEARTBEAT"
LOST_ENV = "MNPAR_LOST_AFTER"
HOST_ENV = "MNPAR_HOST_NAME"  # a host's name in messages, where MPI's is not telling
PERIOD = 2.0
LOST_AFTER = 20.0
CHECK_EVERY = 1.0  # how often a sleeping wait asks
BYE_WAIT = 2.0  # how long an ending rank takes the others' last heartbeats
_ALIVE, _BYE, _FAILING = 1, 0, 2
_TAG = 7


class Monitor:
    """The heartbeat of one process over ``comm``'s ranks (a duplicate is made: collective).

    Args:
        comm: the ranks to watch, usually ``MPI.COMM_WORLD``.
        period: seconds between two heartbeats.
        lost_after: seconds of silence after which a rank is lost.
    """

    def __init__(self, comm: MPI.Comm, period: float, lost_after: float) -> None:
        self.comm = comm.Dup()
        self.rank = comm.rank
        self.period = period
        self.lost_after = lost_after
        self.hosts: List[str] = self.comm.allgather(
            os.environ.get(HOST_ENV) or MPI.Get_processor_name())
        self.peers = [r for r in range(self.comm.size) if r != self.rank]
        now = time.monotonic()
        self.seen: Dict[int, float] = {r: now for r in self.peers}
        self.gone: set = set()  # ranks that said goodbye
        self.failing: set = set()  # ranks whose fail-fast hook runs (``fail_together``)
        self.broken: Dict[int, str] = {}  # peers an MPI call failed for: its error
        self._failing_sends: List[MPI.Request] = []
        self._bufs = {r: bytearray(1) for r in self.peers}
        self._recvs = {r: self.comm.Irecv(self._bufs[r], r, _TAG) for r in self.peers}
        self._sends: Dict[int, MPI.Request] = {}
        self._beat = bytearray([_ALIVE])
        self._stop = threading.Event()
        self._lost_since: Optional[float] = None
        self._next_check = 0.0
        self._thread = threading.Thread(target=self._run, name="mnpar-liveness", daemon=True)
        self._thread.start()

    def lost(self) -> List[int]:
        """The ranks silent for ``lost_after`` seconds (and not gone)."""
        limit = time.monotonic() - self.lost_after
        return [r for r, t in self.seen.items() if t < limit and r not in self.gone]

    def check(self) -> None:
        """Raises ``PeerLost`` if some rank is lost; cheap, and acts once a second."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY
        lost = self.lost()
        if lost:
            raise PeerLost(self.describe(lost))

    def describe(self, lost: List[int]) -> str:
        now = time.monotonic()
        parts = []
        for host in sorted({self.hosts[r] for r in lost}):
            ranks = [r for r in lost if self.hosts[r] == host]
            on_host = [r for r in range(len(self.hosts)) if self.hosts[r] == host]
            silent = max(now - self.seen[r] for r in ranks)
            errors = sorted({self.broken[r] for r in ranks if r in self.broken})
            parts.append(f"rank{'s' if len(ranks) > 1 else ''} "
                         f"{', '.join(map(str, ranks))} on host {host!r} (the host's ranks: "
                         f"{', '.join(map(str, on_host))}), silent for {silent:.0f} s"
                         + "".join(f" (MPI: {e})" for e in errors))
        return (f"rank {self.rank}: lost {'; '.join(parts)}: no heartbeat for more than "
                f"{self.lost_after:g} s ({LOST_ENV}); the host was cut off, stopped or "
                "killed. Resume from the last snapshot every rank agreed on "
                "(--resume auto)")

    def stop(self) -> None:
        """Says goodbye to every rank and stops the thread (the process is ending).

        It then takes the heartbeats still coming until each rank's goodbye
        (they arrive in order), for up to ``BYE_WAIT`` seconds, so that none is
        left unreceived at ``MPI_Finalize``.
        """
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        for req in self._send_all(bytearray([_BYE])).values():
            req.Free()
        deadline = time.monotonic() + BYE_WAIT
        while len(self.gone) < len(self.peers) and time.monotonic() < deadline:
            self._receive(time.monotonic())
            time.sleep(1e-3)
        for r, req in self._recvs.items():
            if r not in self.gone and r not in self.broken:
                with self._peer(r):
                    req.Cancel()
                    req.Wait()

    def fail_together(self, seconds: float) -> None:
        """Tells every rank that this one is failing (its traceback is out), then waits
        up to ``seconds`` until every other rank has said the same, gone, or proved
        unreachable (``broken``): an error raised on every rank is then printed by every
        rank before the first abort ends them all. One failing rank alone waits the
        whole ``seconds``."""
        self._failing_sends = list(self._send_all(bytearray([_FAILING]), queued=True).values())
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._stop.is_set():  # no thread to receive: this one does
                self._receive(time.monotonic())
            if set(self.peers) <= self.failing | self.gone | self.broken.keys():
                return
            time.sleep(5e-3)

    def _receive(self, now: float) -> None:
        """Takes every heartbeat and goodbye that has arrived."""
        for r, req in self._recvs.items():
            with self._peer(r):
                while r not in self.gone and r not in self.broken and req.Test():
                    kind = self._bufs[r][0]
                    if kind == _BYE:
                        self.gone.add(r)
                        break
                    if kind == _FAILING:
                        self.failing.add(r)
                    self.seen[r] = now
                    req = self._recvs[r] = self.comm.Irecv(self._bufs[r], r, _TAG)

    def _send_all(self, payload: bytearray, queued: bool = False) -> Dict[int, MPI.Request]:
        """Posts ``payload`` to every rank not gone whose last heartbeat has left
        (one that has not is cut off: nothing more is queued for it), or, with
        ``queued``, whose has not."""
        sends = {}
        for r in self.peers:
            if r in self.gone or r in self.broken:
                continue
            with self._peer(r):
                if queued or r not in self._sends or self._sends[r].Test():
                    sends[r] = self.comm.Isend(payload, r, _TAG)
        return sends

    @contextlib.contextmanager
    def _peer(self, r: int) -> Iterator[None]:
        """Around MPI calls concerning peer ``r``: an MPI error (a connection to a
        cut host, under Open MPI) marks ``r`` broken instead of ending the thread;
        nothing more is asked of it, and its silence makes it lost, the error named."""
        try:
            yield
        except MPI.Exception as e:
            self.broken[r] = e.Get_error_string()

    def _run(self) -> None:
        next_beat = 0.0
        tick = min(self.period, 0.5)
        while not self._stop.wait(tick):
            now = time.monotonic()
            self._receive(now)
            if now >= next_beat:
                next_beat = now + self.period
                self._sends.update(self._send_all(self._beat))
            self._last_resort(now)

    def _last_resort(self, now: float) -> None:
        """Ends the process if a loss went unnoticed another ``lost_after`` seconds."""
        lost = self.lost()
        if not lost:
            self._lost_since = None
            return
        if self._lost_since is None:
            self._lost_since = now
        elif now - self._lost_since > self.lost_after:
            sys.stderr.write(f"[rank {self.rank}] mnpar: {self.describe(lost)}; ending this "
                             "rank, which was blocked where it could not raise\n")
            sys.stderr.flush()
            os._exit(70)


_monitor: Optional[Monitor] = None


def start(comm: MPI.Comm) -> None:
    """Starts this process's heartbeat over ``comm`` if it is ``COMM_WORLD``'s group;
    collective over ``comm``; once per process. Off with ``MNPAR_HEARTBEAT=0``, on one
    rank, and without ``THREAD_MULTIPLE``."""
    global _monitor
    if _monitor is not None or comm.size == 1:
        return
    if MPI.Comm.Compare(comm, MPI.COMM_WORLD) not in (MPI.IDENT, MPI.CONGRUENT):
        return
    period = float(os.environ.get(PERIOD_ENV, PERIOD))
    if period <= 0 or MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return
    _monitor = Monitor(comm, period, float(os.environ.get(LOST_ENV, LOST_AFTER)))
    failfast.before_abort = _monitor.fail_together


def stop() -> None:
    """Says goodbye and stops the heartbeat (at exit, once the communicators have
    ended: ``_ending``); no-op when off."""
    if _monitor is not None:
        _monitor.stop()


def check() -> None:
    """Raises ``PeerLost`` if this process's heartbeat lost a rank (no-op when off)."""
    if _monitor is not None:
        _monitor.check()
