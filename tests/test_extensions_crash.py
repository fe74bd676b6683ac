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
# Early, at the last iteration, halfway through a write on either rank, and
# between a finished write and its rename.
CRASHES = ["0:iteration:5", "1:iteration:23", "0:write:2", "1:write:4", "1:rename:3"]


def launch(out, *crash):
    env = dict(os.environ, MNPAR_ABORT_ON_ERROR="1")
    return subprocess.run([MPIEXEC, "-n", "2", sys.executable, SCRIPT, str(out), *crash],
                          env=env, capture_output=True, text=True, timeout=180)


def finals(out):
    found = []
    for rank in range(2):
        with np.load(os.path.join(out, f"final_rank{rank}.npz")) as f:
            found.append({k: f[k] for k in f.files})
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("unbroken")
    proc = launch(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return finals(out)


@pytest.mark.slow
@pytest.mark.parametrize("crash", CRASHES)
def test_resume_after_sigkill_equals_unbroken_run(tmp_path, reference, crash):
    crashed = launch(tmp_path, crash)
    assert crashed.returncode != 0, "the armed rank should have been killed"
    assert not (tmp_path / "final_rank0.npz").exists()
    resumed = launch(tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for want, got in zip(reference, finals(tmp_path)):
        assert want.keys() == got.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{crash}: {key}")
