"""examples/mlp/train_mlp.py, launched with ``mpiexec -n 2`` as a user would.

Each run has a hard timeout (its whole process group is killed past it), so a
deadlock fails the test instead of hanging the suite.
"""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from run_suite import ROOT, find_mpiexec

SCRIPT = os.path.join(ROOT, "examples", "mlp", "train_mlp.py")
TIMEOUT = 120


def clean_env():
    """The environment without this process's own MPI launch variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}
    env.update(PYTHONUNBUFFERED="1", MNPAR_TIMEOUT="60", MPLBACKEND="Agg")
    return env


def start(args, n=2, script=SCRIPT):
    """Launches ``mpiexec -n n python script args`` in a process group of its own."""
    mpiexec = [find_mpiexec(), *os.environ.get("MPIEXEC_FLAGS", "").split(), "-n", str(n)]
    return subprocess.Popen([*mpiexec, sys.executable, script, *args], cwd=ROOT,
                            env=clean_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def finish(proc, timeout=TIMEOUT):
    """``(returncode, stdout, stderr)``; kills the whole job past ``timeout``."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(proc.args)} ran past {timeout} s; a deadlock?\n{out}\n{err}")
    return proc.returncode, out, err


def run(args, n=2, script=SCRIPT, timeout=TIMEOUT):
    """Runs the example to its end; returns its stdout; fails the test on an error."""
    code, out, err = finish(start(args, n, script), timeout)
    assert code == 0, f"exit {code}\n--- stdout\n{out}\n--- stderr\n{err}"
    return out


def log_of(out_dir):
    with open(os.path.join(out_dir, "log")) as f:
        return json.load(f)


def arrays(path):
    """Every array of an npz file as raw bytes, keyed by name."""
    with np.load(path) as f:
        return {name: (f[name].dtype.str, f[name].shape, f[name].tobytes()) for name in f.files}


def assert_same_models(dir_a, dir_b):
    for rank in (0, 1):
        a = arrays(os.path.join(dir_a, f"model_rank{rank}.npz"))
        b = arrays(os.path.join(dir_b, f"model_rank{rank}.npz"))
        assert sorted(a) == sorted(b)
        for name in a:
            assert a[name] == b[name], f"rank {rank}: {name} differs"


SEED_ARGS = ["--epoch", "2", "--seed", "3", "--snapshot-interval", "0"]


@pytest.fixture(scope="module")
def send_recv_run(tmp_path_factory):
    """One short run of the default (send-recv) model: its output directory and stdout."""
    out_dir = tmp_path_factory.mktemp("send-recv")
    return out_dir, run(SEED_ARGS + ["--out", str(out_dir)])


@pytest.mark.slow
def test_trains_at_two_ranks_and_writes_logs_plots_and_models(send_recv_run):
    out_dir, out = send_recv_run
    log = log_of(out_dir)
    assert [entry["epoch"] for entry in log] == [1, 2]
    losses = [entry["main/loss"] for entry in log]
    assert all(math.isfinite(x) for x in losses) and losses[1] < losses[0] < math.log(10) + 1
    assert log[-1]["validation/main/accuracy"] > 0.6  # 10 classes: chance is 0.1
    for name in ("model_rank0.npz", "model_rank1.npz", "loss.png", "accuracy.png"):
        assert (out_dir / name).stat().st_size > 0, name
    assert f"log:    {out_dir / 'log'}" in out and str(out_dir / "loss.png") in out
    assert "\033[J" not in out  # no terminal codes in a log that is not a terminal
    assert "send-recv MLP on digits over 2 ranks (naive communicator" in out


@pytest.mark.slow
def test_both_model_styles_train_identically_for_the_same_seed(send_recv_run, tmp_path):
    sr_dir, _ = send_recv_run
    run(SEED_ARGS + ["--model", "chain-list", "--out", str(tmp_path)])
    keys = ("main/loss", "validation/main/loss", "main/accuracy", "validation/main/accuracy")
    curve = [[entry[k] for k in keys] for entry in log_of(sr_dir)]
    assert curve == [[entry[k] for k in keys] for entry in log_of(tmp_path)]
    for rank in (0, 1):  # same layers, other paths: predictor/l1/W vs predictor/0/l1/W
        sr = arrays(sr_dir / f"model_rank{rank}.npz")
        cl = arrays(tmp_path / f"model_rank{rank}.npz")
        layer = re.compile(r"l\d/[Wb]$")
        assert sorted(sr) != sorted(cl)
        assert ({layer.search(k)[0]: v for k, v in sr.items()}
                == {layer.search(k)[0]: v for k, v in cl.items()})


@pytest.mark.parametrize("n", [1, 3])
def test_a_wrong_rank_count_is_one_message_and_a_failing_exit(tmp_path, n):
    code, out, err = finish(start(["--out", str(tmp_path)], n=n))
    assert code != 0
    assert "Traceback" not in out + err
    errors = [line for line in (out + err).splitlines() if "ranks" in line]
    assert len(errors) == 1, out + err
    assert errors[0].startswith("error: train_mlp.py splits the model over exactly 2 ranks, "
                                f"but it runs on {n}; launch it as: mpiexec -n 2 python")
    assert not os.listdir(tmp_path)


def pids_of_rank(root_pid, rank):
    """The processes under ``root_pid`` that MPI launched as ``rank``."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(root_pid, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env:
            found.append(pid)
    return found


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the rank's process in /proc")
def test_resume_after_a_rank_is_killed_equals_an_uninterrupted_run(tmp_path):
    args = ["--epoch", "6", "--snapshot-interval", "20", "--seed", "1"]
    run(args + ["--out", str(tmp_path / "whole")])

    broken = tmp_path / "broken"
    proc = start(args + ["--out", str(broken)])
    deadline = time.monotonic() + TIMEOUT
    first = [broken / f"snapshot_iter_20.rank{r}.npz" for r in (0, 1)]
    while not all(p.exists() for p in first) and proc.poll() is None:
        assert time.monotonic() < deadline, "no snapshot was written"
        time.sleep(0.005)
    victims = pids_of_rank(proc.pid, 1)
    assert victims, "rank 1's process was not found"
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    code, out, err = finish(proc)
    assert code != 0, "the run ended before rank 1 was killed"
    assert not (broken / "model_rank0.npz").exists()

    out = run(args + ["--out", str(broken), "--resume", "auto"])
    start_at = int(re.search(r"resumed from iteration (\d+)", out)[1])
    assert start_at > 0 and start_at % 20 == 0
    assert_same_models(tmp_path / "whole", broken)
    assert log_of(broken)[-1]["main/loss"] == log_of(tmp_path / "whole")[-1]["main/loss"]


@pytest.mark.slow
def test_the_demo_reaches_ninety_percent_validation_accuracy(tmp_path):
    # What `make demo` runs: the defaults (20 epochs on digits, fixed seed).
    out = run(["--out", str(tmp_path)])
    final = log_of(tmp_path)[-1]
    assert final["epoch"] == 20
    assert final["validation/main/accuracy"] >= 0.90
    assert re.search(r"validation accuracy 0\.9\d+ after 20 epochs", out), out
