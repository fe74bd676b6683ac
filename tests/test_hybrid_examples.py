"""examples/data_parallel and examples/dual_parallel, launched as a user would.

Each run has a hard timeout and its whole process group is killed past it.
"""
import os
import re
import signal
import subprocess
import sys

import pytest
from run_suite import ROOT, find_mpiexec

TIMEOUT = 120


def launch(script, n, *args):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "HYDRA_", "MPIR_", "OMPI_"))}
    env.update(PYTHONUNBUFFERED="1", MNPAR_TIMEOUT="60")
    cmd = [find_mpiexec(), *os.environ.get("MPIEXEC_FLAGS", "").split(), "-n", str(n),
           sys.executable, os.path.join(ROOT, "examples", script), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{script} did not finish in {TIMEOUT} s:\n{out}")
    assert proc.returncode == 0, out
    return out


def last_validation_accuracy(out):
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", out)  # PrintReport's cursor codes
    rows = [line.split() for line in plain.splitlines() if re.match(r"^\s*\d+\s+\d", line)]
    return float(rows[-1][-2])


def test_data_parallel_mlp_learns_the_digits(tmp_path):
    out = launch("data_parallel/train_mlp.py", 2, "--epochs", "4", "--out", str(tmp_path))
    assert "2 ranks" in out
    assert last_validation_accuracy(out) > 0.85, out


def test_dual_parallel_pairs_learn_the_digits(tmp_path):
    out = launch("dual_parallel/train_dual.py", 4, "--epochs", "4", "--out", str(tmp_path))
    assert "2 pairs x 2 stages" in out
    assert last_validation_accuracy(out) > 0.85, out
