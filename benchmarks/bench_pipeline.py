"""Pipelined training of a deep MLP over 2 ranks: throughput and peak memory.

Run with two ranks (one core each)::

    mpiexec -n 2 python benchmarks/bench_pipeline.py [--iters 3] [--rounds 3] [--gpu]
        [--ks 2 4 8 16] [--schedules gpipe 1f1b zb1 zb2 zb1-v]

The model: 8 Linear layers of 1024 units with ReLU, batch 256, split 4/4 in
the seed MLP's loop (rank 0: layers 1-4, data and loss; rank 1: layers 5-8,
sending the scores back). Compared: the whole model in one process (rank 0
alone), MultiNodeChainList without pipelining, and ``PipelineUpdater`` with
K = 2, 4, 8, 16 for each schedule; ``zb1-v`` is zb1 over the same layers in
a V (``build_stage(..., chunks=2, placement='v')``: rank 0 layers 1-2 and
7-8, data and loss; rank 1 layers 3-6), ZB-V's placement. Every
configuration is built first; then each round runs ``--iters`` updates of
every configuration in turn, and each keeps its best round, so all see the
same machine conditions.

Two ranks cannot beat the bound of a K-micro-batch pipeline of two equal
stages, times what one process achieves running the whole model in the same
K micro-batches (``single K=…``, which pays the smaller matrix products and
the gradient sums but no bubble): ``2K / (K + 1)`` for gpipe and 1f1b, whose
backward is one action, and ``6K / (3K + 1)`` for the zero-bubble schedules
(ZB-H1's 3Kp / (3K + p - 1) at p = 2, with F = B = W); ``12K / (6K + 1)``
over the V (ZB-V's makespan, 6K + p - 1 ticks of a half-stage chunk, for the
12K ticks of one process). ``vs bound`` is the
pipeline's share of its schedule's bound; what it misses is the executor's
overhead, unequal stages and waits. ``vs plan`` compares it with what the
schedule's own clock predicts for this model (every action's ticks, by the
components' parameter counts, over the plan's makespan): the executor's
share of what its schedule allows. Peak memory is what NumPy allocated at most during
one more update (``tracemalloc``).

On a machine other jobs share, two ranks may not get two cores: each round
also times the same matrix products on rank 0 alone and on both ranks at
once, and the second line reports how many cores' worth the two ranks got
(2.00 on an idle 2-core machine; the median of the rounds), with the load
average.

``--gpu`` runs every configuration on GPUs (``_common.gpu_device``: a GPU per
rank, shared where the ranks outnumber them; activations cross through host
memory), waits for the GPU before each clock read, and gives the peak of
cupy's memory pool during the update instead of NumPy's; the cores' check is
left out.
"""
import argparse
import os
import sys
import time
import tracemalloc

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import GpuPeak, gpu_device, synchronize  # noqa: E402

import mnpar  # noqa: E402
from mnpar.pipeline import PipelineUpdater, build_stage  # noqa: E402
from mnpar.pipeline._schedule import action_cost, rule_of  # noqa: E402

UNITS, LAYERS, BATCH = 1024, 8, 256
KS = (2, 4, 8, 16)
SCHEDULES = ("gpipe", "1f1b", "zb1", "zb2", "zb1-v")  # -v: the same schedule over a V
V = "-v"


def bound(kind, k):
    """The most two equal stages give over one process in the same k micro-batches."""
    if kind.endswith(V):
        return 12 * k / (6 * k + 1)
    return 6 * k / (3 * k + 1) if rule_of(kind).splits else 2 * k / (k + 1)


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


def make(comm, solo, kind, k, device):
    """This rank's updater of one configuration, or None where the rank takes no part."""
    data = dataset()
    if kind == "single":
        if solo is None:
            return None
        it = chainer.iterators.SerialIterator(data, BATCH)
        if kind == "single" and k == 1:
            opt = chainer.optimizers.SGD(0.01).setup(L.Classifier(mlp()).to_device(device))
            return chainer.training.StandardUpdater(it, opt, device=device)
        whole = mnpar.MultiNodeChainList(solo)  # one stage: the micro-batches' work, no bubble
        whole.add_link(mlp(), None, None)
        opt = chainer.optimizers.SGD(0.01).setup(L.Classifier(whole).to_device(device))
        return PipelineUpdater(it, opt, solo, k, schedule="gpipe", device=device)
    if kind.endswith(V):  # 2 Linear layers a part; rank 0: parts 0 and 3
        stage = build_stage(mlp(), [4, 4, 4, 3], comm, chunks=2, placement="v")
        kind = kind[:-len(V)]
    else:
        stage = build_stage(mlp(), [2 * LAYERS - 1 - 7, 7], comm)  # 4 Linear layers each
    target = (L.Classifier(stage) if comm.rank == 0 else stage).to_device(device)
    if comm.rank != 0:
        data = mnpar.datasets.create_empty_dataset(data)
    it = chainer.iterators.SerialIterator(data, BATCH)
    opt = chainer.optimizers.SGD(0.01).setup(target)
    feed = device if comm.rank == 0 else None  # the rank that takes the input
    if kind == "plain":
        return chainer.training.StandardUpdater(it, opt, device=feed)
    return PipelineUpdater(it, opt, comm, k, schedule=kind, device=feed)


def planned(updater):
    """The speed-up over ``single K=…`` the schedule's own clock predicts: all
    actions' ticks (one process runs them all) over the plan's makespan.
    None for what is not a pipeline."""
    if not isinstance(updater, PipelineUpdater) or updater.runner.comm.size < 2:
        return None
    runner = updater.runner
    k = runner.n_microbatches
    schedule = runner.plan(k)
    work = sum(action_cost(runner._costs, rank, a, schedule.split)
               for rank, actions in schedule.items() for a in actions)
    return work / schedule.makespan


def barrier(comm):
    """A barrier that sleeps while it waits, so an idle rank leaves its core alone."""
    request = comm.mpi_comm.Ibarrier()
    while not request.Test():
        time.sleep(1e-4)


def timed(comm, updater, iters, device=None):
    """Iterations per second of ``updater`` (None: this rank waits for the others)."""
    barrier(comm)
    start = time.perf_counter()
    for _ in range(iters):
        if updater is not None:
            updater.update()
    synchronize(device)
    rate = iters / (time.perf_counter() - start)
    barrier(comm)
    return rate


def capacity(comm, products=40):
    """Cores' worth two ranks got: twice rank 0's time alone over the slower rank's, together."""
    a = np.ones((256, UNITS), np.float32)
    w = np.ones((UNITS, UNITS), np.float32)

    def work():
        start = time.perf_counter()
        for _ in range(products):
            a.dot(w)
        return time.perf_counter() - start

    barrier(comm)
    alone = work() if comm.rank == 0 else 0.0
    barrier(comm)
    both = max(comm.allgather_obj(work()))
    return 2 * comm.bcast_obj(alone) / both


def peak(comm, updater, device):
    """The most bytes NumPy (or on a GPU, cupy's pool) held during one update on this rank
    (0 if it takes no part)."""
    barrier(comm)
    if updater is None:
        barrier(comm)
        return 0
    if device.xp is not np:
        with GpuPeak() as gpu:
            updater.update()
            synchronize(device)
        barrier(comm)
        return gpu.peak
    tracemalloc.start()
    updater.update()
    top = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    barrier(comm)
    return top


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=3, help="updates per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gpu", action="store_true",
                        help="run on GPUs (needs cupy): a GPU per rank, shared where fewer")
    parser.add_argument("--ks", type=int, nargs="+", default=KS, help="micro-batches")
    parser.add_argument("--schedules", nargs="+", default=SCHEDULES, choices=SCHEDULES)
    args = parser.parse_args()
    comm = mnpar.create_communicator("naive")
    if comm.size != 2:
        raise SystemExit("run with 2 ranks: mpiexec -n 2 python benchmarks/bench_pipeline.py")
    device = gpu_device(comm.intra_rank) if args.gpu else chainer.get_device("@numpy")
    split = comm.mpi_comm.Split(0 if comm.rank == 0 else MPI.UNDEFINED)
    solo = mnpar.create_communicator("naive", split) if comm.rank == 0 else None
    configs = ([("single", 1), ("plain", 1)] + [("single", k) for k in args.ks]
               + [(s, k) for s in args.schedules for k in args.ks])
    updaters = {}
    for kind, k in configs:
        updaters[kind, k] = make(comm, solo, kind, k, device)
        timed(comm, updaters[kind, k], 1, device)  # warm-up: first-call set-up, allocations
    load = os.getloadavg()[0]
    best = {config: 0.0 for config in configs}
    cores = []
    for _ in range(args.rounds):
        cores.append(capacity(comm) if not args.gpu else float("nan"))
        for config in configs:
            best[config] = max(best[config], timed(comm, updaters[config], args.iters, device))
    peaks = {config: comm.allgather_obj(peak(comm, updaters[config], device))
             for config in configs}
    plans = {config: planned(updaters[config]) for config in configs}
    for updater in updaters.values():
        if isinstance(updater, PipelineUpdater):
            updater.finalize()
    if comm.rank == 0:
        base = best["single", 1]
        print(f"deep MLP: {LAYERS} x Linear({UNITS}), batch {BATCH}, 2 ranks, loop 4/4; best "
              f"of {args.rounds} interleaved rounds of {args.iters} updates")
        if args.gpu:
            print(f"on GPUs: rank 0 {device}; peak MiB: cupy's memory pool")
        else:
            print(f"two ranks got {float(np.median(cores)):.2f} cores' worth of matrix "
                  f"products (median of rounds); load average {load:.2f} at the start, "
                  f"{os.getloadavg()[0]:.2f} at the end")
        print(f"{'configuration':<16}{'it/s':>7}{'vs single':>11}{'vs bound':>10}"
              f"{'vs plan':>9}{'peak MiB r0':>13}{'peak MiB r1':>13}")
        for kind, k in configs:
            rate = best[kind, k]
            name = kind if k == 1 else f"{kind} K={k}"
            share = foreseen = ""
            if kind in SCHEDULES:
                share = f"{rate / (bound(kind, k) * best['single', k]):9.2f}x"
                foreseen = f"{rate / (plans[kind, k] * best['single', k]):8.2f}x"
            p0, p1 = peaks[kind, k]
            print(f"{name:<16}{rate:7.2f}{rate / base:10.2f}x{share:>10}{foreseen:>9}"
                  f"{p0 / 2**20:13.1f}{p1 / 2**20:13.1f}")
    if solo is not None:
        solo.finalize()
    comm.finalize()


if __name__ == "__main__":
    main()
