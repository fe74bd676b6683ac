"""examples/pipeline/train_pipeline.py, launched with ``mpiexec`` as a user would.

Short runs at 2 and 3 ranks (gpipe, zb1, and 1f1b by default), ``--balance auto`` once;
each run has a hard timeout (its whole process group is killed past it), so a
deadlock fails the test instead of hanging the suite.
"""
import math
import os

import pytest
from test_examples_mlp import ROOT, log_of, run

SCRIPT = os.path.join(ROOT, "examples", "pipeline", "train_pipeline.py")
KEYS = ("main/loss", "main/accuracy", "validation/main/loss", "validation/main/accuracy")


def train(out_dir, n, *args):
    """Runs two epochs of a small deep MLP; returns (stdout, the log)."""
    out = run(["--microbatches", "4", "--epochs", "2", "--units", "64", "--out", str(out_dir),
               *args], n=n, script=SCRIPT)
    return out, log_of(out_dir)


@pytest.mark.slow
def test_trains_on_digits_alike_at_two_and_three_ranks_and_three_schedules(tmp_path):
    out, log = train(tmp_path / "two", 2, "--schedule", "gpipe", "--balance", "auto")
    assert "schedule gpipe, 4 micro-batches" in out and "\033[J" not in out
    assert [entry["epoch"] for entry in log] == [1, 2]
    losses = [entry["main/loss"] for entry in log]
    assert all(math.isfinite(x) for x in losses) and losses[1] < losses[0]
    assert log[-1]["validation/main/accuracy"] > 0.5  # 10 classes: chance is 0.1

    out, three = train(tmp_path / "three", 3, "--schedule", "zb1", "--balance", "5,5,5",
                       "--checkpoint", "except_last")
    assert "balance [5, 5, 5] (layers and functions per rank), schedule zb1" in out
    for a, b in zip(log, three):  # the same model and batches: the split does not matter
        assert [b[k] for k in KEYS] == pytest.approx([a[k] for k in KEYS], rel=1e-4)


@pytest.mark.slow
def test_iterations_stop_a_run_before_its_first_epoch_ends(tmp_path):
    out = run(["--iterations", "3", "--microbatches", "2", "--balance", "8,7", "--units", "32",
               "--out", str(tmp_path)], script=SCRIPT)
    assert "schedule 1f1b, 2 micro-batches" in out
    assert not (tmp_path / "log").exists()  # LogReport writes at the end of an epoch
