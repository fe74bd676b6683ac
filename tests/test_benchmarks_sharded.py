"""benchmarks/bench_sharded.py runs (a tiny MLP) and ends with the line the docs quote."""
import os
import re

from test_examples_mlp import ROOT, run

SCRIPT = os.path.join(ROOT, "benchmarks", "bench_sharded.py")


def test_the_benchmark_ends_with_its_ratios():
    out = run(["--widths", "64", "96", "32", "--batchsize", "4", "--rounds", "1", "--steps",
               "1"], n=2, script=SCRIPT)
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"sharded 2 ranks: state per rank 1:\d\.\d\d 2:\d\.\d\d 3:\d\.\d\d of "
                        r"formula; step 1:\d+\.\d\dx 2:\d+\.\d\dx 3:\d+\.\d\dx plain", last), out
    states = [float(s.split(":")[1]) for s in last.split("state per rank ")[1].split()[:3]]
    assert all(0.95 <= s <= 1.05 for s in states), last  # within 5% of the formula
