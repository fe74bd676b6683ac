"""Sharded data parallelism: model state per rank and step time against plain DP.

    mpiexec -n 2 python benchmarks/bench_sharded.py [--rounds 3] [--steps 3] [--batchsize 16]
                                                    [--widths 2048 4096 4096 4096 2048]

The model is an MLP 2048-4096-4096-4096-2048 (50.3 M float32 parameters)
with Adam, on synthetic data, each rank ``--batchsize`` examples. Every
round builds, in turn, plain data parallelism (``stage=0``) and stages 1, 2
and 3 (the same seeded model and the default communicator), times
``--steps`` whole updates after one warm-up (forward, backward, reduction,
update, gather), records what each rank holds, and frees it before the next:
one variant lives at a time, so the benchmark needs about one plain model's
memory per rank (0.8 GB), not four. The cases' order changes from round to
round (``_common.interleaved``); each one's best round counts.

State is the model state a rank holds (parameters, gradients, optimizer
state), counted array by array (``mnpar.optimizers.state_bytes``), over the
formula's 16, 8 + 8/N, 4 + 12/N and 16/N bytes a parameter; stage 3 also
reports the most bytes of gathered links at once and RSS the process's
resident memory after the variant's steps. Step is each stage's step time
over plain data parallelism's in the same run. The last line is the figures
docs/benchmarks.rst quotes.
"""
import argparse
import gc
import os
import resource
import sys
import time
import warnings
from typing import Any, Dict

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu, interleaved, table  # noqa: E402

import mnpar  # noqa: E402
from mnpar.optimizers import state_bytes  # noqa: E402
from mnpar.optimizers._state_bytes import formula  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)
WIDTHS = (2048, 4096, 4096, 4096, 2048)
MB = 1e6


class Mlp(chainer.ChainList):
    def __init__(self, widths: Any) -> None:
        super().__init__(*[L.Linear(a, b) for a, b in zip(widths, widths[1:])])

    def forward(self, x: Any, t: Any) -> Any:
        h = x
        for i, link in enumerate(self):
            h = link(h)
            if i < len(self) - 1:
                h = F.relu(h)
        return F.softmax_cross_entropy(h, t)


def rss() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB


def case(comm: Any, stage: int, args: Any, seen: Dict[int, Dict[str, float]]):
    steps, batch, widths = args.steps, args.batchsize, args.widths

    def run() -> float:
        np.random.seed(0)
        model = Mlp(widths)
        n_params = sum(p.size for p in model.params())
        opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), comm, stage=stage)
        opt.setup(model)
        rng = np.random.RandomState(comm.rank)
        x = rng.standard_normal((batch, widths[0])).astype(np.float32)
        t = rng.randint(0, widths[-1], batch).astype(np.int32)
        opt.update(model, x, t)  # warm-up: buffers, shards, Adam's state
        comm.mpi_comm.Barrier()
        best = float("inf")
        for _ in range(steps):
            start = time.perf_counter()
            opt.update(model, x, t)
            best = min(best, time.perf_counter() - start)
        used = state_bytes(opt)
        want = sum(formula(stage, comm.size, n_params).values())
        seen[stage] = {"params": n_params, "state": used.total, "formula": want,
                       "p": used.parameters, "g": used.gradients, "s": used.optimizer_state,
                       "gathered": used.peak_gathered, "rss": rss()}
        if stage:
            opt.free()
        del opt, model
        gc.collect()
        return best
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batchsize", type=int, default=16)
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS),
                        help="the MLP's layer widths (the default has 50.3 M parameters)")
    args = parser.parse_args()
    comm = mnpar.create_communicator()
    seen: Dict[int, Dict[str, float]] = {}
    cases = {stage: case(comm, stage, args, seen) for stage in range(4)}
    times = interleaved(cases, args.rounds)
    step = {s: min(ts) for s, ts in times.items()}
    worst = comm.mpi_comm.allreduce(max(seen[s]["state"] / seen[s]["formula"] for s in seen),
                                    op=MPI.MAX)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    if comm.rank == 0:
        n = seen[0]["params"]
        print(f"sharded data parallelism, {comm.size} ranks ({comm.name}), MLP "
              f"{'-'.join(map(str, args.widths))} ({n / 1e6:.1f} M float32 parameters), Adam, "
              f"{args.batchsize} examples a rank, best of {args.rounds} rounds of "
              f"{args.steps} updates; {cpu()}")
        rows = []
        for s in range(4):
            v = seen[s]
            rows.append([f"stage {s}" if s else "plain (stage 0)", f"{step[s] * 1e3:.0f}",
                         f"{step[s] / step[0]:.2f}x", f"{v['p'] / MB:.0f}", f"{v['g'] / MB:.0f}",
                         f"{v['s'] / MB:.0f}", f"{v['state'] / v['params']:.2f}",
                         f"{v['state'] / v['formula']:.3f}", f"{v['gathered'] / MB:.0f}",
                         f"{v['rss']:.0f}"])
        print(table(["", "ms/step", "vs plain", "params MB", "grads MB", "state MB",
                     "B/param", "of formula", "gathered MB", "RSS MB"], rows))
        print(f"peak RSS of rank 0: {peak:.0f} MB; worst state over formula on any rank: "
              f"{worst:.3f}")
        print(f"sharded {comm.size} ranks: state per rank "
              + " ".join(f"{s}:{seen[s]['state'] / seen[s]['formula']:.2f}" for s in (1, 2, 3))
              + " of formula; step "
              + " ".join(f"{s}:{step[s] / step[0]:.2f}x" for s in (1, 2, 3)) + " plain")
    comm.finalize()


if __name__ == "__main__":
    main()
