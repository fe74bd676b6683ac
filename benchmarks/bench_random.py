"""What drawing by place costs: chainer's random functions under ``mnpar.random.scope``
against chainer's own draws, in one process and pipelined.

Run with two ranks (one core each)::

    mpiexec -n 2 python benchmarks/bench_random.py [--rounds 15] [--iters 2] [--gpu]
        [--units 1024] [--batch 256] [--image 128]

Four pairs, each measured side by side in interleaved rounds, chainer's own
draw against the same work inside a scope; a pair's ratio is the median over
the rounds of the scope's time over chainer's in the same round (with its
quartiles: the machine's noise moves both of a round alike), the times the
best of the rounds:

- ``dropout``: ``F.dropout(x, 0.1)`` on a (256, 4096) float32 array, rank 0
  alone: one run of consecutive numbers (NumPy's Philox in C).
- ``tile``: the same on a 2 x 2 tile, (8, 32, 64, 64) of (8, 32, 128, 128):
  rows of 64 numbers (the array operations' path).
- ``one process``: an update of an MLP (4 x Linear(1024) with ReLU and
  dropout 0.1, batch 256, SGD), rank 0 alone.
- ``pipelined``: the same MLP cut 2/2 over both ranks, ``PipelineUpdater``
  with 4 micro-batches (1f1b).

The last line is ``random 2 ranks: scope over chainer's own: dropout X.XXx,
tile X.XXx, one process X.XXx, pipelined X.XXx`` (time under the scope over
time without it, the median of the rounds; 1.00x costs nothing).
"""
import argparse
import os
import statistics
import sys
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu, gpu_device, synchronize  # noqa: E402

import mnpar  # noqa: E402
from mnpar.pipeline import PipelineUpdater, build_stage  # noqa: E402

K = 4


def mlp(units):
    np.random.seed(0)
    layers = []
    for _ in range(4):
        layers += [L.Linear(units, units), F.relu, lambda h: F.dropout(h, 0.1)]
    return chainer.Sequential(*layers[:-2], L.Linear(units, 10))


class Op(chainer.Link):
    """One dropout, as a link (a scope names draws by the links they happen in)."""

    def forward(self, x):
        return F.dropout(x, 0.1)


def data(n, units):
    rng = np.random.RandomState(0)
    return chainer.datasets.TupleDataset(rng.randn(n, units).astype(np.float32),
                                         rng.randint(0, 10, n).astype(np.int32))


def case(run, model, optimizer, scoped, device):
    """A case: seconds for ``run()``, inside a scope or not."""
    def timed():
        synchronize(device)
        start = time.perf_counter()
        if scoped:
            with mnpar.random.scope(model, optimizer, seed=0):
                run()
        else:
            run()
        synchronize(device)
        return time.perf_counter() - start
    return timed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=2, help="calls or updates per round")
    parser.add_argument("--gpu", action="store_true", help="run on GPUs (needs cupy)")
    parser.add_argument("--units", type=int, default=1024, help="the MLP's width")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--image", type=int, default=128, help="the tile's whole image side")
    args = parser.parse_args()
    units, batch, side = args.units, args.batch, args.image
    comm = mnpar.create_communicator("naive")
    if comm.size != 2:
        raise SystemExit("run with 2 ranks: mpiexec -n 2 python benchmarks/bench_random.py")
    device = gpu_device(comm.intra_rank) if args.gpu else chainer.get_device("@numpy")
    xp = device.xp
    rank0 = comm.rank == 0
    cases = {}
    for scoped in (False, True):
        tag = "scope" if scoped else "chainer"
        op = Op()
        x = xp.asarray(np.random.RandomState(1).randn(batch, 4 * units).astype(np.float32))
        tile = xp.asarray(np.random.RandomState(2).randn(8, 32, side // 2, side // 2)
                          .astype(np.float32))

        def dropout(x=x, op=op):
            for _ in range(args.iters):
                op(x)

        def tiled(tile=tile, op=op):
            for _ in range(args.iters):
                with mnpar.random.sharded(2, side // 2, side), \
                        mnpar.random.sharded(3, 0, side):
                    op(tile)

        model = L.Classifier(mlp(units)).to_device(device)
        opt = chainer.optimizers.SGD(0.01).setup(model)
        single = chainer.training.StandardUpdater(
            chainer.iterators.SerialIterator(data(2 * batch, units), batch), opt, device=device)

        def updates(updater):
            def update():
                for _ in range(args.iters):
                    updater.update()
            return update

        alone = {"dropout": case(dropout, op, None, scoped, device),  # rank 0 alone
                 "tile": case(tiled, op, None, scoped, device),
                 "one process": case(updates(single), model, opt, scoped, device)}
        for name, timed in alone.items():
            cases[name, tag] = timed if rank0 else None
        whole = mlp(units)
        stage = build_stage(whole, [6, 5], comm)
        target = (L.Classifier(stage) if rank0 else stage).to_device(device)
        dataset = data(2 * batch, units)
        if not rank0:
            dataset = mnpar.datasets.create_empty_dataset(dataset)
        popt = chainer.optimizers.SGD(0.01).setup(target)
        pipe = PipelineUpdater(chainer.iterators.SerialIterator(dataset, batch), popt, comm, K,
                               schedule="1f1b", device=device if rank0 else None)
        cases["pipelined", tag] = case(updates(pipe), whole, popt, scoped, device)
    for run in cases.values():
        if run is not None:
            run()  # warm-up
    times = {name: [] for name in cases}
    order = list(cases)
    for r in range(args.rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            if name[0] != "pipelined":
                if rank0:
                    times[name].append(cases[name]())
                MPI.COMM_WORLD.Barrier()
            else:
                times[name].append(cases[name]())
    if rank0:
        print(f"{cpu()}; {args.rounds} interleaved rounds of {args.iters} calls or updates"
              f"{' on GPUs' if args.gpu else ''}; load average {os.getloadavg()[0]:.2f}")
        print(f"{'case':<14}{'chainer ms':>12}{'scope ms':>10}{'ratio':>8}{'quartiles':>16}")
        ratios = []
        for name in ("dropout", "tile", "one process", "pipelined"):
            a, b = times[name, "chainer"], times[name, "scope"]
            per_round = [y / x for x, y in zip(a, b)]
            first, median, third = statistics.quantiles(per_round, n=4)
            ratios.append(median)
            print(f"{name:<14}{min(a) / args.iters * 1e3:12.2f}{min(b) / args.iters * 1e3:10.2f}"
                  f"{median:7.2f}x{first:8.2f}-{third:.2f}")
        print("random 2 ranks: scope over chainer's own: dropout {:.2f}x, tile {:.2f}x, "
              "one process {:.2f}x, pipelined {:.2f}x".format(*ratios))
    comm.finalize()


if __name__ == "__main__":
    main()
