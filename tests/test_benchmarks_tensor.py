"""benchmarks/bench_tensor.py runs (tiny sizes) and ends with the line the docs quote."""
import os
import re

from test_examples_mlp import ROOT, run

SCRIPT = os.path.join(ROOT, "benchmarks", "bench_tensor.py")


def test_the_benchmark_ends_with_its_ratios():
    out = run(["--units", "32", "--heads", "4", "--batch", "2", "--length", "8", "--rounds",
               "2", "--steps", "1"], n=2, script=SCRIPT)
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"tensor 2 ranks: step \d+\.\d\dx one process, model state per rank "
                        r"\d\.\d\dx", last), out
    state = float(last.rsplit(" ", 1)[-1][:-1])
    assert 0.4 < state < 0.7  # each rank holds about half of the block
