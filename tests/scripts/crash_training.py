"""A small training run over N ranks that can kill one of its ranks on purpose.

    mpiexec -n N python crash_training.py OUT [RANK:POINT:N]

The model is a loop: rank 0's layer feeds rank 1, each further rank adds a
layer, and the last rank's output comes back to rank 0 for the loss.

POINT is ``iteration`` (SIGKILL when iteration N ends, before its snapshot),
``write`` (SIGKILL halfway through writing the N-th snapshot file) or
``rename`` (SIGKILL after writing the N-th snapshot, before its rename).
Without a crash the run resumes from the newest common snapshot in OUT and
ends by writing every rank's parameters to ``OUT/final_rank{R}.npz``.
"""
import os
import signal
import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import serializers, training

import mnpar
from mnpar.extensions import _snapshot

ITERATIONS, SNAPSHOT_EVERY = 24, 3


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(comm, out: str, spec: str, trainer) -> None:
    rank, point, n = spec.split(":")
    if int(rank) != comm.rank:
        return
    n = int(n)
    if point == "iteration":
        @training.make_extension(trigger=(1, "iteration"), priority=1000)
        def kill(t):
            if t.updater.iteration == n:
                die()
        trainer.extend(kill)
        return
    calls = {"count": 0}
    if point == "write":
        real_save = _snapshot.serializers.save_npz

        def save_half_then_die(path, obj, *args, **kwargs):
            calls["count"] += 1
            if calls["count"] == n:
                real_save(path, obj, *args, **kwargs)
                with open(path, "r+b") as f:
                    f.truncate(os.path.getsize(path) // 2)
                die()
            real_save(path, obj, *args, **kwargs)
        _snapshot.serializers.save_npz = save_half_then_die
    elif point == "rename":
        real_replace = _snapshot.os.replace

        def replace_or_die(src, dst):
            if dst.endswith(".npz") and os.path.dirname(dst) == out:
                calls["count"] += 1
                if calls["count"] == n:
                    die()
            real_replace(src, dst)
        _snapshot.os.replace = replace_or_die


def normal(seed: int) -> chainer.Initializer:
    return chainer.initializers.Normal(0.3, rng=np.random.RandomState(seed))


class Lower(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(8, 16, initialW=normal(1))

    def forward(self, x):
        return F.relu(self.l1(x))


class Upper(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l2 = L.Linear(16, 3, initialW=normal(2))

    def forward(self, h):
        return self.l2(h)


class Middle(chainer.Chain):
    def __init__(self, seed: int):
        super().__init__()
        with self.init_scope():
            self.lm = L.Linear(16, 16, initialW=normal(seed))

    def forward(self, h):
        return F.relu(self.lm(h))


class Identity(chainer.Chain):
    def forward(self, y):
        return y


def main() -> None:
    out = sys.argv[1]
    comm = mnpar.create_communicator("naive", timeout=60)
    model = mnpar.MultiNodeChainList(comm)
    last = comm.size - 1
    if comm.rank == 0:
        model.add_link(Lower(), rank_in=None, rank_out=1)
        model.add_link(Identity(), rank_in=last, rank_out=None)
        target = L.Classifier(model)
    elif comm.rank < last:
        model.add_link(Middle(10 + comm.rank), rank_in=comm.rank - 1, rank_out=comm.rank + 1)
        target = model
    else:
        model.add_link(Upper(), rank_in=last - 1, rank_out=0)
        target = model
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
    data = chainer.datasets.TupleDataset(x, y)
    if comm.rank != 0:
        data = mnpar.datasets.create_empty_dataset(data)
    iterator = chainer.iterators.SerialIterator(data, 8, shuffle=False)
    optimizer = chainer.optimizers.Adam(alpha=0.01)
    optimizer.setup(target)
    updater = training.StandardUpdater(iterator, optimizer)
    trainer = training.Trainer(updater, (ITERATIONS, "iteration"), out=out)
    trainer.extend(mnpar.extensions.snapshot(comm, n_retains=2,
                                             trigger=(SNAPSHOT_EVERY, "iteration")))
    if len(sys.argv) > 2:
        arm(comm, out, sys.argv[2], trainer)
    mnpar.extensions.resume(comm, trainer)
    trainer.run()
    serializers.save_npz(os.path.join(out, f"final_rank{comm.rank}.npz"), target)
    comm.finalize()


if __name__ == "__main__":
    main()
