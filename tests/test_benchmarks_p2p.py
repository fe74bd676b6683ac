"""benchmarks/bench_p2p.py and p2p_floor.py run small under ``mpiexec -n 2``, and the paired
statistics of benchmarks/_common.py: the figures in docs/benchmarks.rst come
from these, so they must keep running and computing what they say."""
import os
import re
import sys

import pytest
from test_examples_mlp import ROOT, finish, start

SCRIPT = os.path.join(ROOT, "benchmarks", "bench_p2p.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from _common import paired_excess, paired_ratio  # noqa: E402

ROW = re.compile(r"^ *(4|64) KiB( +[0-9.]+){6}( +[0-9.]+x){5}"
                 r"(( +[+-][0-9.]+ +[+-][0-9.]+ \[[+-][0-9.]+, [+-][0-9.]+\])+)$", re.M)


def test_paired_excess_is_the_quartiles_of_each_rounds_difference():
    # raw moves from round to round; the case stays 2 over it, then once 10 over
    times = {"raw": [5, 1, 9, 3, 7], "case": [7, 3, 11, 5, 17]}
    assert paired_excess(times, "case") == pytest.approx((2, 2, 6))
    assert paired_excess(times, "raw") == (0, 0, 0)


def test_paired_ratio_is_the_median_of_each_rounds_ratio():
    # raw's best (1) and the case's best (2) come from different rounds: 0.5x;
    # round by round the case takes 1.25x raw's time, once 4x
    times = {"raw": [4, 1, 8, 12, 16], "case": [5, 4, 10, 15, 20]}
    assert paired_ratio(times, "case") == pytest.approx(0.8)
    assert paired_ratio(times, "raw") == 1


@pytest.mark.parametrize("extra", [[], ["--rewrite", "--against", ROOT],
                                   ["--against", ROOT, "--against", ROOT]])
def test_bench_p2p_prints_a_row_per_size(extra):
    code, out, err = finish(start(["--sizes", "4096,65536", "--rounds", "2", *extra],
                                  script=SCRIPT))
    assert code == 0, f"exit {code}\n--- stdout\n{out}\n--- stderr\n{err}"
    rows = ROW.findall(out)
    assert [size for size, *_ in rows] == ["4", "64"], out
    # mnpar's excess over raw, and with --against each other checkout's first
    assert all(len(re.findall(r"\[", excess)) == 1 + extra.count("--against")
               for *_, excess, _ in rows), out
    assert ("written anew before every send" in out) == ("--rewrite" in extra), out


def test_p2p_floor_prints_every_case_per_size():
    code, out, err = finish(start(["--sizes", "4096,65536", "--rounds", "2"],
                                  script=os.path.join(ROOT, "benchmarks", "p2p_floor.py")))
    assert code == 0, f"exit {code}\n--- stdout\n{out}\n--- stderr\n{err}"
    found = re.findall(r"^ *(4|64) KiB +(\S.*?) +[0-9.]+ +[+-][0-9.]+ +[+-][0-9.]+ \[", out, re.M)
    inline = ["raw", "bare", "bare, mnpar's waits", "transport", "mnpar"]
    large = inline[:3] + ["bare, posted early", "one message, struct datatype"] + inline[3:]
    assert found == [("4", case) for case in inline] + [("64", case) for case in large], out
