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

