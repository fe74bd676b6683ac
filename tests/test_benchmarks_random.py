"""benchmarks/bench_random.py runs (tiny sizes) and ends with the line the docs quote."""
import os
import re

from test_examples_mlp import ROOT, run

SCRIPT = os.path.join(ROOT, "benchmarks", "bench_random.py")


def test_the_benchmark_ends_with_its_ratios():
    out = run(["--units", "32", "--batch", "8", "--image", "16", "--rounds", "2",
               "--iters", "1"], n=2, script=SCRIPT)
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"random 2 ranks: scope over chainer's own: dropout \d+\.\d\dx, tile "
                        r"\d+\.\d\dx, one process \d+\.\d\dx, pipelined \d+\.\d\dx", last), out
