"""Failures across test hosts: a rank killed, a host's ranks killed, a host cut off.

``scripts/failures.py`` sums arrays over every rank, over and over, on 2
hosts x 2 ranks; while it runs the test kills a rank, kills every rank of h2,
or sets h2's link down. The job must end on its own, every surviving rank's
error naming the lost ranks and their host (the first rank's error ends the
others: ``mnpar`` aborts the job), long before ``MNPAR_TIMEOUT``
(600 s here): a cut-off host by the heartbeat (``mnpar.PeerLost``, 20 s of
silence by default), within 30 s of the cut.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
from _hosts import PREFIX, ROOT, Cluster

SCRIPT = os.path.join(ROOT, "tests", "cluster", "scripts", "failures.py")
pytestmark = pytest.mark.timeout(300)  # a start on busy cores, then up to 30 s of failure
LAYOUT = [2, 2]  # ranks 0, 1 on h1; 2, 3 on h2


def rank_pids(host):
    """The Python ranks among them (not hydra's proxy)."""
    found = []
    for pid in Cluster.pids(int(host[1:])):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if SCRIPT.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def run_and(cluster, act, after=1.0):
    """Runs the script; ``after`` seconds after every rank has summed 20 times, calls
    ``act()``. Returns (code, stderr, seconds from the act to the job's end)."""
    acted = {}
    started = tempfile.mktemp(prefix="mnpar-failures-")

    def later():
        deadline = time.monotonic() + 120  # a start on busy cores can take a while
        while not os.path.exists(started) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(after)
        acted["t"] = time.monotonic()
        act()
    threading.Thread(target=later, daemon=True).start()
    env = cluster.env(MNPAR_TIMEOUT="600", FAILURES_STARTED=started)
    env.pop("MNPAR_HEARTBEAT", None)
    env.pop("MNPAR_LOST_AFTER", None)
    code, out, err = cluster.run(LAYOUT, [sys.executable, SCRIPT], timeout=180, env=env)
    ended = time.monotonic()
    if os.path.exists(started):
        os.remove(started)
    assert "t" in acted, (code, out, err)
    assert "step" in out, out  # it ran before the failure
    return code, err, ended - acted["t"]


def wait_gone(host, seconds):
    """Whether every rank of ``host`` has ended within ``seconds``."""
    deadline = time.monotonic() + seconds
    while rank_pids(host):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_rank_killed_ends_the_job_at_once(cluster):
    code, err, took = run_and(cluster, lambda: os.kill(rank_pids("h2")[0], signal.SIGKILL))
    assert code not in (0, None), err
    assert took < 10, err
    assert wait_gone("h1", 10) and wait_gone("h2", 10)


def test_a_hosts_ranks_killed_end_the_job_at_once(cluster):
    def kill_h2():
        for pid in rank_pids("h2"):
            os.kill(pid, signal.SIGKILL)
    code, err, took = run_and(cluster, kill_h2)
    assert code not in (0, None), err
    assert took < 10, err
    assert wait_gone("h1", 10)


def test_a_host_cut_off_is_named_by_every_rank_within_30_seconds(cluster):
    def cut():
        subprocess.run(["ip", "link", "set", PREFIX + "h2", "down"], check=True)
    try:
        code, err, took = run_and(cluster, cut)
        assert code not in (0, None), err
        assert took < 30, (took, err)
        # h1's ranks, whose output reaches the launcher: each raises PeerLost at once,
        # and the first to abort ends the other (which may not have printed yet). The
        # two h2 ranks' last heartbeats may arrive up to a tick apart: the first check
        # past the limit may find one of them over it, or both.
        assert any(re.search(rf"\[rank {rank}\] mnpar\._errors\.PeerLost: rank {rank}: lost "
                             r"(ranks 2, 3|rank 2|rank 3) on host 'h2' \(the host's ranks: "
                             r"2, 3\)", err) for rank in (0, 1)), err
        # h2's ranks, cut off from the launcher, end on their own too (h1 is silent
        # to them): none is left waiting for its timeout.
        assert wait_gone("h2", 30)
    finally:
        Cluster.reconnect(2)


MLP = os.path.join(ROOT, "examples", "mlp", "train_mlp.py")
MLP_ARGS = ["--epoch", "6", "--snapshot-interval", "20", "--seed", "1"]


def models(out):
    """Every rank's final parameters: rank r's file is in its own host's directory."""
    found = {}
    for r, host in enumerate(("h1", "h2")):
        with np.load(out / host / f"model_rank{r}.npz") as f:
            found[r] = {k: f[k].tobytes() for k in f.files}
    return found


def test_resume_after_a_host_is_cut_off_equals_an_uninterrupted_run(cluster, tmp_path):
    # The snapshot directory is per host (--out DIR/{host}): each host sees only
    # its own rank's snapshots, as on a cluster without a shared file system.
    env = cluster.env(MPLBACKEND="Agg", MNPAR_TIMEOUT="600", MNPAR_LOST_AFTER="5",
                      MNPAR_HEARTBEAT="1")
    whole, broken = tmp_path / "whole", tmp_path / "broken"

    def mlp(out, *extra):
        return [sys.executable, MLP, *MLP_ARGS, "--out", f"{out}/{{host}}", *extra]
    cluster.run_ok([1, 1], mlp(whole), timeout=120, env=env)
    assert not (whole / "h1" / "model_rank1.npz").exists()  # really one directory per host

    first = [broken / "h1" / "snapshot_iter_20.rank0.npz",
             broken / "h2" / "snapshot_iter_20.rank1.npz"]

    def cut_after_first_snapshot():
        deadline = time.monotonic() + 60
        while not all(p.exists() for p in first) and time.monotonic() < deadline:
            time.sleep(0.01)
        subprocess.run(["ip", "link", "set", PREFIX + "h2", "down"], check=True)
    cutter = threading.Thread(target=cut_after_first_snapshot, daemon=True)
    cutter.start()
    try:
        code, out, err = cluster.run([1, 1], mlp(broken), timeout=120, env=env)
    finally:
        cutter.join()
        subprocess.run(["ip", "link", "set", PREFIX + "h2", "up"], check=True)
    assert code not in (0, None), (out, err)
    assert "PeerLost" in err and "host 'h2'" in err, err
    assert not (broken / "h1" / "model_rank0.npz").exists()  # it did not finish
    assert wait_gone("h2", 30)

    out = cluster.run_ok([1, 1], mlp(broken, "--resume", "auto"), timeout=120, env=env)
    resumed = int(re.search(r"resumed from iteration (\d+)", out)[1])
    assert resumed > 0 and resumed % 20 == 0, out
    assert models(broken) == models(whole)  # bit-identical
