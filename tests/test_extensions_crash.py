"""SIGKILL a rank at many moments, resume, and end exactly where an unbroken run ends.

Each case kills one rank (at an iteration, halfway through writing a
snapshot, or between writing and renaming it), then runs the job again,
which resumes from the newest snapshot every rank wrote completely. The
final parameters of every rank must equal, bit for bit, those of a run that
was never interrupted.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "crash_training.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
# (ranks, crash): early, at the last iteration, halfway through a write on
# either rank, and between a finished write and its rename; with three ranks,
# the middle rank mid-write and at an iteration, the last between write and rename.
CRASHES = [(2, "0:iteration:5"), (2, "1:iteration:23"), (2, "0:write:2"), (2, "1:write:4"),
           (2, "1:rename:3"), (3, "1:write:3"), (3, "2:rename:5"), (3, "1:iteration:14")]


def launch(out, n, *crash):
    env = dict(os.environ, MNPAR_ABORT_ON_ERROR="1")
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, SCRIPT, str(out), *crash],
                          env=env, capture_output=True, text=True, timeout=180)


def finals(out, n):
    found = []
    for rank in range(n):
        with np.load(os.path.join(out, f"final_rank{rank}.npz")) as f:
            found.append({k: f[k] for k in f.files})
    return found


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Every rank's final parameters of an unbroken run, per rank count (run once each)."""
    cache = {}

    def of(n):
        if n not in cache:
            out = tmp_path_factory.mktemp(f"unbroken{n}")
            proc = launch(out, n)
            assert proc.returncode == 0, proc.stderr[-3000:]
            cache[n] = finals(out, n)
        return cache[n]
    return of


@pytest.mark.slow
@pytest.mark.parametrize("n, crash", CRASHES)
def test_resume_after_sigkill_equals_unbroken_run(tmp_path, references, n, crash):
    reference = references(n)
    crashed = launch(tmp_path, n, crash)
    assert crashed.returncode != 0, "the armed rank should have been killed"
    assert not (tmp_path / "final_rank0.npz").exists()
    resumed = launch(tmp_path, n)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert len(reference) == n
    for want, got in zip(reference, finals(tmp_path, n)):
        assert want.keys() == got.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{crash}: {key}")
