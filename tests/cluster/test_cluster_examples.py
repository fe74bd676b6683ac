"""The seed examples with their two ranks on two hosts equal the same runs on one host.

Each example splits its model over exactly two ranks, so rank 0 runs on h1
and rank 1 on h2 and every activation and gradient crosses the test network
over TCP; the reference is the same command with both ranks on h1 (shared
memory). As on one machine (tests/test_examples_*.py), the logged losses and
every saved parameter must be equal bit for bit, with one BLAS thread per rank
in both layouts.
"""
import json
import os
import sys

import numpy as np
import pytest
from _hosts import ROOT, Cluster

EXAMPLES = {
    "mlp": ("mlp/train_mlp.py", ["--epoch", "2", "--seed", "3", "--snapshot-interval", "0"]),
    "seq2seq": ("seq2seq/train_seq2seq.py",
                ["--toy-pairs", "320", "--epoch", "2", "--unit", "32", "--layer", "2",
                 "--seed", "2", "--max-length", "12"]),
}


def arrays(path):
    with np.load(path) as f:
        return {name: (f[name].dtype.str, f[name].shape, f[name].tobytes()) for name in f.files}


def train(cluster, layout, example, out):
    script, args = EXAMPLES[example]
    argv = [sys.executable, os.path.join(ROOT, "examples", script), *args, "--out", str(out)]
    # One BLAS thread per rank in both layouts: mnpar would give each rank its host's share
    # of the cores (two threads on a host of its own, one beside another rank), and GEMM
    # with two threads sums in another order (1e-9 apart on the AMD EPYC VMs).
    cluster.run_ok(layout, argv, timeout=90,
                   env=Cluster.env(MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1"))
    with open(out / "log") as f:
        log = json.load(f)
    return log, [arrays(out / f"model_rank{r}.npz") for r in (0, 1)]


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_model_split_across_hosts_trains_as_on_one_host(cluster, tmp_path, example):
    sent = Cluster.sent_bytes(2)
    across_log, across = train(cluster, [1, 1], example, tmp_path / "across")
    assert Cluster.sent_bytes(2) - sent > 100_000  # rank 1's activations went over h2's veth
    one_log, one = train(cluster, [2], example, tmp_path / "one-host")
    assert len(across_log) == 2 and all(np.isfinite(e["main/loss"]) for e in across_log)
    assert [e["main/loss"] for e in across_log] == [e["main/loss"] for e in one_log]
    for rank in (0, 1):
        assert sorted(across[rank]) == sorted(one[rank]) and across[rank]
        for name in one[rank]:
            assert across[rank][name] == one[rank][name], f"rank {rank}: {name} differs"
