"""Data and hybrid parallelism across hosts: model-parallel pairs inside a host,
data-parallel replicas across hosts (``scripts/hybrid.py``).

On 2 hosts x 2 ranks each pair shares a host and each stage's gradients are
averaged over the network; on 4 hosts x 1 rank both cross it. Every rank
checks its links, after a send/recv update and after pipelined updates of
every training schedule, against the whole model trained in one process.
"""
import os
import sys

import pytest
from _hosts import ROOT, results

SCRIPT = os.path.join(ROOT, "tests", "cluster", "scripts", "hybrid.py")


@pytest.mark.parametrize("layout", [[2, 2], [1, 1, 1, 1]], ids=["2x2", "4x1"])
@pytest.mark.parametrize("dp", ["naive", "hierarchical"])
def test_pairs_in_a_host_replicas_across_hosts_train_as_one_process(cluster, layout, dp):
    out = cluster.run_ok(layout, [sys.executable, SCRIPT, dp], timeout=90)
    found = results(out)
    assert [r["rank"] for r in found] == [0, 1, 2, 3], out
    for r in found:
        rank = r["rank"]
        assert r["mp"] == [rank % 2, 2] and r["dp"] == [rank // 2, 2], r
        hosts = len(layout)
        # The pair is one node on 2x2 (two on 4x1); a stage's replicas are always two.
        assert r["mp_inter"] == ([0, 1] if hosts == 2 else [rank % 2, 2]), r
        assert r["dp_inter"] == [rank // 2, 2], r
        assert "pipeline 1f1b" in r["checked"] and "pipeline zb1" in r["checked"], r
        assert "send/recv double_buffering=True" in r["checked"], r
