"""The fault matrix: an exception anywhere in a training step ends the job within seconds.

Each case runs ``scripts/faults.py`` on 2 ranks, under a chainer Trainer with
the default settings (fail-fast on, a 600 s timeout): one construct (how the
model is split or trained) with one fault (where ``FaultInjected`` is raised,
on one rank, at iteration 3). The job must end with a non-zero exit within
10 s of the fault, and the injected exception must be the first and the last
error in its output, every error line marked with the rank that printed it:
no wait of a cleanup path (chainer's Trainer finalizes its updater and
extensions before it re-raises) may time out, and no other rank may report
an error of its own first.
"""
import os
import re
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "scripts"))
# isort: split
from faults import CONSTRUCTS, FAULTS  # noqa: E402

SCRIPT = os.path.join(HERE, "scripts", "faults.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
LIMIT = 10.0  # seconds from the fault to the job's end
# An error line: an exception's name and its message, or chainer's own report.
ERROR = re.compile(r"\b(\w+(Error|Exception|Injected|Timeout|Lost|Finished)): |"
                   r"Exception in main training loop: ")
# Every construct with every fault: a layer's forward on each rank, the others on rank 0
# or 1 in turn.
CASES = [(c, f, r) for i, c in enumerate(CONSTRUCTS) for j, f in enumerate(FAULTS)
         for r in ((0, 1) if f == "forward" else ((i + j) % 2,))]


def run(construct: str, fault: str, rank: int):
    env = dict(os.environ)
    for name in ("MNPAR_TIMEOUT", "MNPAR_ABORT_ON_ERROR", "MNPAR_HEARTBEAT"):
        env.pop(name, None)  # the defaults, as a user has them
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-W", "ignore", SCRIPT,
                           construct, fault, str(rank)],
                          env=env, capture_output=True, text=True, timeout=120)
    return proc, time.monotonic()


@pytest.mark.slow
@pytest.mark.parametrize("construct, fault, rank", CASES)
def test_a_fault_ends_the_job_within_seconds_with_its_own_error(construct, fault, rank):
    proc, ended = run(construct, fault, rank)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    fired = re.search(r"fault injected at ([0-9.]+)", out)
    assert fired, out[-3000:]
    took = ended - float(fired[1])
    assert took < LIMIT, f"{took:.1f} s\n{out[-3000:]}"
    errors = [line for line in out.splitlines() if ERROR.search(line)]
    assert errors and "boom on purpose" in errors[0], "\n".join(errors) or out[-3000:]
    assert "boom on purpose" in errors[-1], "\n".join(errors)
    # Every error line says which rank printed it, chainer's own report included.
    assert all(re.match(r"\[rank \d\] ", line) for line in errors), "\n".join(errors)
    assert f"[rank {rank}] FaultInjected: boom on purpose ({fault})" in out, out[-3000:]
    for secondary in ("CommunicationTimeout", "PeerFinished", "PeerLost", "did not complete"):
        assert secondary not in out, out[-3000:]
    print(f"{construct} {fault} rank {rank}: ended {took:.2f} s after the fault")


@pytest.mark.slow
def test_every_construct_trains_without_a_fault():
    # The control: the same jobs with the fault on no rank (rank 2 of 2) finish.
    for construct in CONSTRUCTS:
        proc, _ = run(construct, "forward", 2)
        assert proc.returncode == 0, (construct, proc.stderr[-3000:])
        assert proc.stdout.count("finished") == 2, (construct, proc.stdout)
