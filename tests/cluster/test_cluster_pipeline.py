"""PipelineUpdater with its stages on different hosts: one update equals the unpipelined one.

``scripts/pipeline.py`` puts one stage on every rank of a chain; each rank
compares its stage after one pipelined update, for every training schedule
(``1f1b`` and ``zb1`` among them) and 1 and 3 micro-batches, with an
unpipelined update and with the whole model trained in one process.
"""
import os
import sys

import pytest
from _hosts import ROOT, results

SCRIPT = os.path.join(ROOT, "tests", "cluster", "scripts", "pipeline.py")


@pytest.mark.parametrize("layout", [[1, 1], [1, 1, 1, 1], [2, 2]],
                         ids=["2 stages on 2 hosts", "4 stages on 4 hosts", "4 stages on 2x2"])
def test_stages_on_different_hosts_update_as_one_process(cluster, layout):
    out = cluster.run_ok(layout, [sys.executable, SCRIPT], timeout=90)
    found = results(out)
    assert [r["rank"] for r in found] == list(range(sum(layout))), out
    for r in found:
        schedules = {s for s, _ in r["checked"]}
        assert {"1f1b", "zb1"} <= schedules, r
        assert sorted({k for _, k in r["checked"]}) == [1, 3], r
        assert r["params"] == 2, r
