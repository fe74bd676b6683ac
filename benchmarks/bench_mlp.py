"""The seed's two-rank MLP trained with mnpar and with ChainerMN, side by side.

Run with ``mpiexec -n 2 python benchmarks/bench_mlp.py``. Both frameworks
train the tutorial's model (``MLP0`` on rank 0: ``l1`` then a hand-off to
rank 1 and back; ``MLP1`` on rank 1: ``l2``, ``l3``) written once against the
shared public API (``create_communicator``, ``MultiNodeChainList``), on the
same synthetic MNIST-shaped data, in alternating timed rounds; each
framework's best round counts. The ratio is mnpar's iterations per second
over ChainerMN's.
"""
import argparse
import time
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from mpi4py import MPI

import mnpar

warnings.filterwarnings("ignore", category=FutureWarning)  # ChainerMN's experimental notes
warnings.filterwarnings("ignore", category=UserWarning)
import chainermn  # noqa: E402  (after the filters: it warns on import)

N_IN, N_OUT = 784, 10
CONFIGS = [(200, 32), (1000, 100)]
TARGETS = {(200, 32): 1.25, (1000, 100): 1.0}


def build(mn, comm, n_units):
    """The tutorial's model for this rank, written against framework ``mn``."""

    class MLP0SubA(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.l1 = L.Linear(N_IN, n_units)

        def forward(self, x):
            return F.relu(self.l1(x))

    class MLP0SubB(chainer.Chain):
        def forward(self, y):
            return y

    class MLP0(mn.MultiNodeChainList):
        def __init__(self):
            super().__init__(comm=comm)
            self.add_link(MLP0SubA(), rank_in=None, rank_out=1)
            self.add_link(MLP0SubB(), rank_in=1, rank_out=None)

    class MLP1Sub(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.l2 = L.Linear(n_units, n_units)
                self.l3 = L.Linear(n_units, N_OUT)

        def forward(self, h0):
            return self.l3(F.relu(self.l2(h0)))

    class MLP1(mn.MultiNodeChainList):
        def __init__(self):
            super().__init__(comm=comm)
            self.add_link(MLP1Sub(), rank_in=0, rank_out=0)

    return L.Classifier(MLP0()) if comm.rank == 0 else MLP1()


def train(model, optimizer, batches, rank) -> None:
    for x, t in batches:
        if rank == 0:
            optimizer.update(model, x, t)
        else:
            optimizer.update(model)


def timed_round(model, optimizer, batches, rank, world) -> float:
    world.Barrier()
    start = time.perf_counter()
    train(model, optimizer, batches, rank)
    world.Barrier()
    return len(batches) / (time.perf_counter() - start)


def bench(n_units: int, batch: int, iters: int, rounds: int, world) -> dict:
    rank = world.rank
    rng = np.random.RandomState(0)
    batches = [(rng.rand(batch, N_IN).astype(np.float32),
                rng.randint(0, N_OUT, batch).astype(np.int32)) for _ in range(iters)]
    setups = {}
    for name, mn in (("mnpar", mnpar), ("chainermn", chainermn)):
        comm = mn.create_communicator("naive")
        model = build(mn, comm, n_units)
        optimizer = chainer.optimizers.SGD(lr=0.01)
        optimizer.setup(model)
        train(model, optimizer, batches[:5], rank)  # warm up (and mnpar's wiring check)
        setups[name] = (model, optimizer)
    best = {name: 0.0 for name in setups}
    for _ in range(rounds):
        for name, (model, optimizer) in setups.items():
            best[name] = max(best[name], timed_round(model, optimizer, batches, rank, world))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=200, help="iterations per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        raise SystemExit("run with mpiexec -n 2")
    rows = []
    for n_units, batch in CONFIGS:
        iters = args.iters if n_units < 1000 else max(10, args.iters // 4)
        best = bench(n_units, batch, iters, args.rounds, world)
        rows.append((n_units, batch, best["mnpar"], best["chainermn"]))
    if world.rank == 0:
        print(f"{'units':>6} {'batch':>6} {'mnpar it/s':>12} {'chainermn it/s':>15} "
              f"{'ratio':>7} {'target':>7}")
        for n_units, batch, ours, theirs in rows:
            ratio = ours / theirs
            target = TARGETS[(n_units, batch)]
            verdict = "ok" if ratio >= target else "BELOW"
            print(f"{n_units:>6} {batch:>6} {ours:>12.1f} {theirs:>15.1f} {ratio:>6.2f}x "
                  f"{target:>5.2f}x {verdict}")


if __name__ == "__main__":
    main()
