"""examples/data_parallel and examples/dual_parallel, launched as a user would.

Each run has a hard timeout and its whole process group is killed past it. The
runs go through tests/scripts/own_values.py, which notes every rank's own
training loss and accuracy, so the tests can check that the example's log
holds their means over the ranks.
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from run_suite import ROOT, find_mpiexec

TIMEOUT = 120
OWN_VALUES = os.path.join(ROOT, "tests", "scripts", "own_values.py")


def launch(script, n, *args):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "HYDRA_", "MPIR_", "OMPI_"))}
    env.update(PYTHONUNBUFFERED="1", MNPAR_TIMEOUT="60")
    cmd = [find_mpiexec(), *os.environ.get("MPIEXEC_FLAGS", "").split(), "-n", str(n),
           sys.executable, OWN_VALUES, os.path.join(ROOT, "examples", script), *args]
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


def assert_logs_the_mean_over_ranks(out_dir, ranks):
    """The log's training values are the means of the ranks' own ones, not rank 0's alone."""
    with open(out_dir / "log") as f:
        log = json.load(f)
    own = []
    for rank in ranks:
        with open(out_dir / f"own_values.rank{rank}.json") as f:
            own.append(json.load(f))
    assert sorted(glob.glob(str(out_dir / "own_values.rank*.json"))) == sorted(
        str(out_dir / f"own_values.rank{rank}.json") for rank in ranks)
    assert [entry["epoch"] for entry in log] == list(range(1, len(log) + 1))
    for entry in log:
        for key in ("main/loss", "main/accuracy"):
            per_rank = [[row[key] for row in rows if row["epoch"] == entry["epoch"]]
                        for rows in own]
            assert len({len(values) for values in per_rank}) == 1 and per_rank[0]
            assert entry[key] == pytest.approx(np.mean(per_rank), rel=1e-5), key
            # Regression: rank 0's log showed rank 0's own shard alone.
            assert entry[key] != pytest.approx(np.mean(per_rank[0]), rel=1e-4), key


def test_data_parallel_mlp_learns_the_digits(tmp_path):
    out = launch("data_parallel/train_mlp.py", 2, "--epochs", "4", "--out", str(tmp_path))
    assert "2 ranks (hierarchical, @numpy)" in out
    assert last_validation_accuracy(out) > 0.85, out
    assert "\033" not in out  # no terminal codes in a log that is not a terminal
    assert_logs_the_mean_over_ranks(tmp_path, [0, 1])


def test_dual_parallel_pairs_learn_the_digits(tmp_path):
    out = launch("dual_parallel/train_dual.py", 4, "--epochs", "4", "--out", str(tmp_path))
    assert "2 pairs x 2 stages (@numpy)" in out
    assert last_validation_accuracy(out) > 0.85, out
    assert "\033" not in out
    assert_logs_the_mean_over_ranks(tmp_path, [0, 2])  # stage 0 of each pair has the loss
