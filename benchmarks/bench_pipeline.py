"""Pipelined training of a deep MLP over 2 ranks: throughput and peak memory.

Run with two ranks (one core each)::

    mpiexec -n 2 python benchmarks/bench_pipeline.py [--iters 8]

The model: 8 Linear layers of 1024 units with ReLU, batch 256, split 4/4 in
the seed MLP's loop (rank 0: layers 1-4, data and loss; rank 1: layers 5-8,
sending the scores back). Compared, one run each: the whole model in one
process (rank 0 alone), MultiNodeChainList without pipelining, and
``PipelineUpdater`` with K = 2, 4, 8, 16 for each schedule. Peak memory is
what NumPy allocated at most during one more update (``tracemalloc``).
"""
import argparse
import time
import tracemalloc

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

import mnpar
from mnpar.pipeline import PipelineUpdater, build_stage

UNITS, LAYERS, BATCH = 1024, 8, 256


def mlp():
    np.random.seed(0)
    layers = []
    for i in range(LAYERS):
        layers.append(L.Linear(UNITS, UNITS))
        if i < LAYERS - 1:
            layers.append(F.relu)
    return chainer.Sequential(*layers)


def dataset(n=BATCH * 4):
    rng = np.random.RandomState(0)
    return chainer.datasets.TupleDataset(rng.randn(n, UNITS).astype(np.float32),
                                         rng.randint(0, UNITS, n).astype(np.int32))


def make(comm, kind, k):
    """(updater, its finalizer) for one configuration on this rank."""
    data = dataset()
    if kind == "single":
        target = L.Classifier(mlp())
        it = chainer.iterators.SerialIterator(data, BATCH)
        opt = chainer.optimizers.SGD(0.01).setup(target)
        return chainer.training.StandardUpdater(it, opt)
    stage = build_stage(mlp(), [2 * LAYERS - 1 - 7, 7], comm)  # 4 Linear layers each
    target = L.Classifier(stage) if comm.rank == 0 else stage
    if comm.rank != 0:
        data = mnpar.datasets.create_empty_dataset(data)
    it = chainer.iterators.SerialIterator(data, BATCH)
    opt = chainer.optimizers.SGD(0.01).setup(target)
    if kind == "plain":
        return chainer.training.StandardUpdater(it, opt)
    return PipelineUpdater(it, opt, comm, k, schedule=kind)


def measure(comm, kind, k, iters):
    """(iterations per second, peak bytes on this rank) of one configuration."""
    runs = kind != "single" or comm.rank == 0
    updater = make(comm, kind, k) if runs else None
    for _ in range(2):
        if runs:
            updater.update()
    comm.mpi_comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        if runs:
            updater.update()
    comm.mpi_comm.Barrier()
    rate = iters / (time.perf_counter() - start)
    peak = 0
    if runs:
        tracemalloc.start()
        updater.update()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if kind not in ("single", "plain"):
            updater.finalize()
    comm.mpi_comm.Barrier()
    return rate, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=8)
    args = parser.parse_args()
    comm = mnpar.create_communicator("naive")
    if comm.size != 2:
        raise SystemExit("run with 2 ranks: mpiexec -n 2 python benchmarks/bench_pipeline.py")
    configs = [("single", 1), ("plain", 1)] + [(s, k) for s in ("gpipe", "1f1b")
                                               for k in (2, 4, 8, 16)]
    rows = []
    for kind, k in configs:
        rate, peak = measure(comm, kind, k, args.iters)
        peaks = comm.allgather_obj(peak)
        rows.append((kind, k, rate, peaks))
    if comm.rank == 0:
        base = rows[0][2]
        print(f"deep MLP: {LAYERS} x Linear({UNITS}), batch {BATCH}, 2 ranks, loop 4/4, "
              f"{args.iters} timed updates")
        print(f"{'configuration':<16}{'it/s':>8}{'vs single':>11}{'peak MiB r0':>13}"
              f"{'peak MiB r1':>13}")
        for kind, k, rate, peaks in rows:
            name = kind if kind in ("single", "plain") else f"{kind} K={k}"
            print(f"{name:<16}{rate:8.2f}{rate / base:10.2f}x{peaks[0] / 2**20:13.1f}"
                  f"{peaks[1] / 2**20:13.1f}")
    comm.finalize()


if __name__ == "__main__":
    main()
