"""Gradient averaging: multi_node_mean_grad against raw MPI Allreduce.

    mpiexec -n 2 python benchmarks/bench_allreduce.py [--rounds 7]

The model is Linear 784-2000-2000-10 (5.6M float32 parameters, 22 MB of
gradients). Each round times, in turn, a raw in-place ``Allreduce`` of one
buffer of the same bytes, mnpar's ``multi_node_mean_grad`` with each CPU
communicator, and ChainerMN's (CPU ``naive``). "raw mean" is the raw
allreduce followed by ``buf *= 1/size``: the same work as a mean, so the
second ratio shows what mnpar adds over raw MPI. Before every timed call the
gradients are fresh arrays, as after ``cleargrads`` and ``backward``; that
set-up is not timed. Ratio: raw time / library time (1.0 = as fast as raw).
"""
import argparse
import os
import sys
import time
import warnings

import chainer
import chainer.links as L
import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import best_of_interleaved, table  # noqa: E402

import mnpar  # noqa: E402

REPEAT = 10


def make_model() -> chainer.Chain:
    model = chainer.Sequential(L.Linear(784, 2000), L.Linear(2000, 2000), L.Linear(2000, 10))
    rng = np.random.default_rng(MPI.COMM_WORLD.rank)
    for p in model.params():
        p.grad = rng.standard_normal(p.data.shape).astype(np.float32)
    return model


def mean_grad_case(mean_grad, model):
    grads = [(p, p.grad.copy()) for p in model.params()]

    def run() -> float:
        total = 0.0
        for _ in range(REPEAT):
            for p, g in grads:
                p.grad = g.copy()
            MPI.COMM_WORLD.Barrier()
            start = time.perf_counter()
            mean_grad(model)
            total += time.perf_counter() - start
        return total / REPEAT
    return run


def raw_case(nbytes: int, mean: bool = False):
    """Raw in-place ``Allreduce``; with ``mean``, then ``*= 1/size``: the work
    ``multi_node_mean_grad`` does."""
    source = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
    world = MPI.COMM_WORLD
    inv = np.float32(1.0 / world.size)

    def run() -> float:
        total = 0.0
        for _ in range(REPEAT):
            buf = source.copy()
            world.Barrier()
            start = time.perf_counter()
            world.Allreduce(MPI.IN_PLACE, buf, MPI.SUM)
            if mean:
                buf *= inv
            total += time.perf_counter() - start
        return total / REPEAT
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    model = make_model()
    nbytes = sum(p.grad.nbytes for p in model.params())
    cases = {"raw Allreduce": raw_case(nbytes), "raw mean": raw_case(nbytes, mean=True)}
    comms = {}
    for name in ("naive", "flat", "hierarchical"):
        comms[name] = mnpar.create_communicator(name)
        cases[f"mnpar {name}"] = mean_grad_case(comms[name].multi_node_mean_grad, model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import chainermn

            cmn = chainermn.create_communicator("naive")
        cases["chainermn naive"] = mean_grad_case(cmn.multi_node_mean_grad, model)
    except Exception as e:  # pragma: no cover - chainermn ships inside chainer
        if world.rank == 0:
            print(f"ChainerMN unavailable: {e}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        best = best_of_interleaved(cases, args.rounds)
    raw, raw_mean = best["raw Allreduce"], best["raw mean"]
    rows = [[name, f"{t * 1e3:.2f}", f"{nbytes / t / 1e9:.2f}", f"{raw / t:.2f}x",
             f"{raw_mean / t:.2f}x"] for name, t in best.items()]
    if world.rank == 0:
        n_params = sum(p.size for p in model.params())
        print(f"{world.size} ranks, {n_params / 1e6:.2f}M float32 parameters "
              f"({nbytes / 1e6:.1f} MB), best of {args.rounds} rounds of {REPEAT} calls")
        print(table(["", "ms", "GB/s", "vs raw", "vs raw mean"], rows))
        print("raw mean: the raw Allreduce, then one pass dividing by the number of ranks")
        print("pure_nccl: needs a GPU; not measured here")
        print("target: every mnpar communicator at least 0.95x raw")
    for c in comms.values():
        c.finalize()


if __name__ == "__main__":
    main()
