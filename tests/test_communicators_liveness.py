"""The heartbeat: a rank that stops answering is named within seconds, not at the timeout.

Each test launches its own ``mpiexec`` (a stopped rank must not take pytest
with it). A rank stopped with SIGSTOP stands for a host cut off: alive for
the launcher, silent for its peers; ``tests/cluster`` cuts real test hosts.
"""
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
FAST = {"MNPAR_HEARTBEAT": "0.5", "MNPAR_LOST_AFTER": "3"}


def launch(tmp_path, source, n, env_extra, timeout=60):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, **env_extra)
    start = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, str(script)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


@pytest.mark.slow
def test_a_silent_rank_is_named_long_before_the_timeout(tmp_path):
    proc, took = launch(tmp_path, """
        import os, signal, time
        import mnpar
        comm = mnpar.create_communicator("naive", timeout=600)
        if comm.rank == 2:
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGSTOP)  # alive, but silent
        comm.recv(source=2)
    """, 3, FAST)
    assert proc.returncode != 0
    assert took < 20, proc.stderr  # 3 s of silence, the abort, start-up; not 600 s
    assert "mnpar._errors.PeerLost: rank " in proc.stderr, proc.stderr
    assert re.search(r"lost rank 2 on host '[^']+' \(the host's ranks: [0-9, ]+\), silent "
                     r"for [3-9] s: no heartbeat for more than 3 s", proc.stderr), proc.stderr


@pytest.mark.slow
def test_busy_or_finished_ranks_are_not_lost(tmp_path):
    # Rank 1 computes in pure Python (holding the GIL but for the switch interval)
    # for 3x the loss limit while rank 0 waits; rank 2 ends early: its goodbye says
    # it is gone, not lost. Nothing may be reported.
    proc, _ = launch(tmp_path, """
        import time
        import numpy as np
        import mnpar
        comm = mnpar.create_communicator("naive", timeout=600)
        if comm.rank == 1:
            end = time.monotonic() + 9
            n = 0
            while time.monotonic() < end:
                n += 1
            comm.send(np.array([n]), dest=0)
        elif comm.rank == 0:
            print("got", comm.recv(source=1)[0] > 0, flush=True)
    """, 3, FAST)
    assert proc.returncode == 0, proc.stderr
    assert "got True" in proc.stdout
    assert "PeerLost" not in proc.stderr and "lost" not in proc.stderr



class Unreachable:
    """A communicator whose sends fail, as Open MPI's do to a host cut off."""

    def __init__(self, comm):
        self.comm = comm

    def Isend(self, *args):
        from mpi4py import MPI
        raise MPI.Exception(MPI.ERR_OTHER)

    def __getattr__(self, name):
        return getattr(self.comm, name)


@pytest.mark.mpi(min_size=2)
def test_a_peer_whose_sends_fail_is_lost_with_the_mpi_error_and_the_thread_lives():
    # Regression: the MPI error ended the heartbeat thread ("Exception in thread
    # mnpar-liveness"), and with it the last resort that ends a rank stuck in MPI.
    from mpi4py import MPI

    from mnpar.communicators import _liveness
    monitor = _liveness.Monitor(MPI.COMM_WORLD, period=0.1, lost_after=1.0)
    real, monitor.comm = monitor.comm, Unreachable(monitor.comm)
    time.sleep(1.5)
    try:
        assert monitor._thread.is_alive()
        assert sorted(monitor.broken) == monitor.peers
        assert sorted(monitor.lost()) == monitor.peers
        with pytest.raises(_liveness.PeerLost, match=r"silent for \d+ s \(MPI: .+\): no "
                                                     r"heartbeat for more than 1 s"):
            monitor.check()
    finally:
        monitor.comm = real
        monitor.broken.clear()  # goodbyes both ways: nothing left posted at exit
        monitor.stop()
        real.Barrier()
