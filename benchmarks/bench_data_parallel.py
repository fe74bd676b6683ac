"""Data-parallel training throughput: one process, mnpar and ChainerMN side by side.

    mpiexec -n 2 python benchmarks/bench_data_parallel.py [--rounds 5] [--no-allreduce]

The model is an MLP 784-1000-1000-10 (1.8M float32 parameters) on synthetic
MNIST-shaped data, trained with MomentumSGD. Each round times, in turn:

* one process (rank 0 alone, the others wait) on the global batch of
  ``size x --batchsize`` examples;
* mnpar's ``create_multi_node_optimizer`` with its default communicator,
  with ``naive``, and with double buffering, each rank on ``--batchsize``;
* ChainerMN's ``create_multi_node_optimizer`` over its ``naive`` communicator.

A timed step is a whole update (forward, backward, gradient averaging,
update); each case's best round counts. Throughput is global examples per
second; ``vs 1 proc`` is the speed-up over one process on the same global
batch, ``vs ChainerMN`` the ratio to ChainerMN. Every process keeps the BLAS
threads mnpar gives it (its share of the node's cores), the single process
included. Unless ``--no-allreduce``, the gradient-averaging comparison of
``bench_allreduce`` (22 MB against raw ``Allreduce``) runs first.
"""
import argparse
import os
import sys
import time
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import best_of_interleaved, table  # noqa: E402

import mnpar  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)  # ChainerMN's experimental notes
warnings.filterwarnings("ignore", category=UserWarning)
import chainermn  # noqa: E402  (after the filters: it warns on import)

STEPS = 10


def make_model() -> L.Classifier:
    np.random.seed(0)
    return L.Classifier(chainer.Sequential(L.Linear(784, 1000), F.relu, L.Linear(1000, 1000),
                                           F.relu, L.Linear(1000, 10)))


def make_batches(rows: int, seed: int):
    rng = np.random.RandomState(seed)
    return [(rng.rand(rows, 784).astype(np.float32), rng.randint(0, 10, rows).astype(np.int32))
            for _ in range(STEPS)]


def training_case(optimizer, model, batches, active: bool = True):
    """Seconds per update over ``STEPS`` updates (two untimed updates warm up first)."""
    for x, t in batches[:2]:
        if active:
            optimizer.update(model, x, t)

    def run() -> float:
        if not active:
            return float("inf")
        start = time.perf_counter()
        for x, t in batches:
            optimizer.update(model, x, t)
        return (time.perf_counter() - start) / STEPS
    return run


def allreduce_section(rounds: int) -> None:
    """``bench_allreduce``'s raw Allreduce against mnpar's communicators."""
    import bench_allreduce as ba

    world = MPI.COMM_WORLD
    model = ba.make_model()
    nbytes = sum(p.grad.nbytes for p in model.params())
    cases = {"raw Allreduce": ba.raw_case(nbytes)}
    comms = {name: mnpar.create_communicator(name) for name in ("hierarchical", "naive")}
    for name, c in comms.items():
        cases[f"mnpar {name}"] = ba.mean_grad_case(c.multi_node_mean_grad, model)
    best = best_of_interleaved(cases, rounds)
    raw = best["raw Allreduce"]
    if world.rank == 0:
        print(f"gradient averaging, {world.size} ranks, {nbytes / 1e6:.1f} MB, best of "
              f"{rounds} rounds")
        print(table(["", "ms", "vs raw"],
                    [[n, f"{t * 1e3:.2f}", f"{raw / t:.2f}x"] for n, t in best.items()]))
        print()
    for c in comms.values():
        c.finalize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batchsize", type=int, default=100, help="examples per rank")
    parser.add_argument("--no-allreduce", action="store_true")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if not args.no_allreduce:
        allreduce_section(args.rounds)
    default = mnpar.create_communicator()
    naive = mnpar.create_communicator("naive")
    cmn = chainermn.create_communicator("naive")
    mine = make_batches(args.batchsize, 1 + world.rank)
    whole = make_batches(args.batchsize * world.size, 0)

    def opt(make, comm, **kw):
        model = make_model()
        return make(chainer.optimizers.MomentumSGD(), comm, **kw).setup(model), model

    cases = {}
    single = make_model()
    cases["one process"] = training_case(
        chainer.optimizers.MomentumSGD().setup(single), single, whole, world.rank == 0)
    for name, (o, m) in {
        f"mnpar {default.name}": opt(mnpar.create_multi_node_optimizer, default),
        "mnpar naive": opt(mnpar.create_multi_node_optimizer, naive),
        f"mnpar {default.name} double-buffered": opt(mnpar.create_multi_node_optimizer,
                                                     default, double_buffering=True),
        "chainermn naive": opt(chainermn.create_multi_node_optimizer, cmn),
    }.items():
        cases[name] = training_case(o, m, mine)
    best = best_of_interleaved(cases, args.rounds)
    rows = []
    global_batch = args.batchsize * world.size
    for name, t in best.items():
        rows.append([name, f"{t * 1e3:.1f}", f"{global_batch / t:.0f}",
                     f"{best['one process'] / t:.2f}x", f"{best['chainermn naive'] / t:.2f}x"])
    if world.rank == 0:
        print(f"data-parallel MLP 784-1000-1000-10, {world.size} ranks x {args.batchsize} "
              f"examples per update (one process: {global_batch}), best of {args.rounds} "
              f"rounds of {STEPS} updates")
        print(table(["", "ms/update", "examples/s", "vs 1 proc", "vs ChainerMN"], rows))
    for c in (default, naive):
        c.finalize()


if __name__ == "__main__":
    main()
