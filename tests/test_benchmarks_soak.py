"""benchmarks/soak.py, run small under ``mpiexec -n 3``: every criterion must pass.

A few dozen iterations instead of 2000, with a hard timeout, so a deadlock
fails the test instead of hanging the suite.
"""
import os
import re

import pytest
from test_examples_mlp import ROOT, finish, start

SCRIPT = os.path.join(ROOT, "benchmarks", "soak.py")


@pytest.mark.slow
def test_a_short_soak_resumes_bit_for_bit_without_leaks(tmp_path):
    code, out, err = finish(start(["--iterations", "40", "--warmup", "10", "--out",
                                   str(tmp_path)], n=3, script=SCRIPT))
    assert code == 0, f"exit {code}\n--- stdout\n{out}\n--- stderr\n{err}"
    assert "run B: 20 iterations, snapshot, then 20 more resumed from iteration 20" in out
    assert re.search(r"max \|loss A - loss B\|, iterations 21-40 +0 \(bit-equal\) +0 +PASS",
                     out), out
    assert re.search(r"final parameters A == B, every rank +yes +yes +PASS", out), out
    assert re.search(r"iterations 1-20, A vs B1: 0 \(bit-equal\)", out), out
    for criterion in ("RSS growth after warm-up", "sends pending after barrier",
                      "stray messages after barrier"):
        assert re.search(re.escape(criterion) + r".* PASS$", out, re.M), out
    for rank in range(3):  # one row per rank: no send pending, no stray message in any run
        assert re.search(rf"^ +{rank} .* 0/0/0 +0/0/0$", out, re.M), out
    assert out.rstrip().endswith("soak: PASS")
    assert sorted(os.listdir(tmp_path)) == [f"snapshot_iter_20.rank{r}.npz" for r in range(3)]


def test_a_wrong_rank_count_is_one_message_and_a_failing_exit():
    code, out, err = finish(start(["--iterations", "4"], n=2, script=SCRIPT))
    assert code == 2, out + err
    assert "Traceback" not in out + err
    assert "error: soak.py runs on exactly 3 ranks, not 2" in err
