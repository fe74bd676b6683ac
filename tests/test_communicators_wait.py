"""Waits honour their timeout and leave the CPU to the rank being waited for."""
import resource
import time

import pytest
from mpi4py import MPI

from mnpar import CommunicationTimeout, PeerFinished, PeerLost
from mnpar.communicators import _wait


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def test_timeout_names_what_was_awaited_and_cancels():
    comm = MPI.COMM_SELF.Dup()
    req = comm.Irecv(bytearray(8), source=0, tag=7)
    start = time.monotonic()
    with pytest.raises(CommunicationTimeout, match="waited for tag 7 after"):
        _wait.wait([req], 0.3, lambda t: f"waited for tag 7 after {t:.1f} s")
    assert 0.3 <= time.monotonic() - start < 2.0
    comm.Free()


def test_waiting_does_not_burn_a_core():
    comm = MPI.COMM_SELF.Dup()
    req = comm.Irecv(bytearray(8), source=0, tag=1)
    cpu = _cpu_seconds()
    with pytest.raises(CommunicationTimeout):
        _wait.wait([req], 1.0, lambda t: "nothing")
    # A spinning wait would use about 1 s of CPU; the back-off uses a few percent.
    assert _cpu_seconds() - cpu < 0.25
    comm.Free()


def test_probe_times_out_without_a_message():
    comm = MPI.COMM_SELF.Dup()
    with pytest.raises(CommunicationTimeout, match="no message"):
        _wait.probe(lambda: comm.Improbe(0, 3), 0.2, lambda t: "no message")
    comm.Free()


def test_completed_requests_return_at_once():
    comm = MPI.COMM_SELF.Dup()
    buf = bytearray(4)
    send = comm.Isend(b"abcd", 0, 2)
    recv = comm.Irecv(buf, 0, 2)
    _wait.wait([send, recv], 1.0, lambda t: "unused")
    assert bytes(buf) == b"abcd"
    comm.Free()


def test_settled_says_whether_requests_complete_within_the_quick_phase():
    comm = MPI.COMM_SELF.Dup()
    pending = comm.Irecv(bytearray(4), source=0, tag=5)
    assert not _wait.settled([pending])
    done = comm.Isend(b"abcd", 0, 5)
    assert _wait.settled([done, pending]) and _wait.settled([done])
    comm.Free()


def test_a_long_spin_still_finds_a_lost_host_within_a_second(monkeypatch):
    # A wait for a transfer of many bytes spins long (n / SPIN_BANDWIDTH: 1000 s
    # here); it must check the peers once a second meanwhile, not after.
    def lost():
        raise PeerLost("rank 1 lost")
    monkeypatch.setattr(_wait.liveness, "check", lost)
    comm = MPI.COMM_SELF.Dup()
    req = comm.Irecv(bytearray(8), source=0, tag=8)
    start = time.monotonic()
    with pytest.raises(PeerLost, match="rank 1 lost"):
        _wait.wait([req], None, lambda t: "a large transfer", nbytes=10**12)
    assert time.monotonic() - start < 1.0
    comm.Free()


class _FinishedPeer:
    """A wait's description whose peer has finished (as ``_waiting.Waiting`` reports)."""

    def __call__(self, elapsed):
        return "a message from rank 1"

    def finished(self):
        return "rank 1 has finished: its program ended", 0.0


def test_a_finished_peer_ends_a_likely_spin_after_the_grace_not_the_spin():
    # The wait for the next message from a peer that last sent many bytes spins
    # longer (``likely``), but no byte is known to be on its way: once the peer
    # has finished, FINISH_GRACE decides, not the 1000 s spin.
    comm = MPI.COMM_SELF.Dup()
    req = comm.Irecv(bytearray(8), source=0, tag=9)
    start = time.monotonic()
    with pytest.raises(PeerFinished, match="rank 1 has finished"):
        _wait.keep_waiting([req], None, _FinishedPeer(), likely=10**12)
    assert _wait.FINISH_GRACE <= time.monotonic() - start < _wait.FINISH_GRACE + 1.0
    comm.Free()
