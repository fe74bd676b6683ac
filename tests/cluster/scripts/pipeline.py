"""One rank of test_cluster_pipeline: a chain of one stage per rank, one pipelined update.

::

    rank      0            1 .. size-2      size-1
    stage     Dense(6, 8)  Dense(8, 8)      Dense(8, 4), softmax cross entropy
    data      inputs       -                labels

For every training schedule and 1 and 3 micro-batches (3 does not divide the
batch of 10), one ``PipelineUpdater`` update must leave this rank's stage
equal to one unpipelined update of the same ``MultiNodeChainList`` and to one
update of the whole model in this process (float64, seeded weights); the last
rank's loss must equal the whole model's. A mismatch raises, which ends the
job; then each rank prints ``RESULT {json}`` with what it compared.
"""
import os
import sys

import chainer
import chainer.links as L
import numpy as np
from _report import report

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from helpers import Dense, float64  # noqa: E402  tests/helpers.py: the pipeline tests' layer

import mnpar
from mnpar.pipeline import PipelineUpdater
from mnpar.pipeline._schedule import TRAINING_SCHEDULES

BATCH = 10
MICROBATCHES = (1, 3)


def layers(n):
    """The whole model's ``n`` stages, seeded: the same float64 weights on every call."""
    np.random.seed(7)
    return [float64(Dense(6 if i == 0 else 8, 4 if i == n - 1 else 8, relu=i < n - 1))
            for i in range(n)]


def data():
    rng = np.random.RandomState(3)
    return rng.randn(BATCH, 6), rng.randint(0, 4, BATCH).astype(np.int32)


def stage(comm):
    """(target, dataset, own stage) of this rank."""
    r, last = comm.rank, comm.size - 1
    part = layers(comm.size)[r]
    x, t = data()
    m = mnpar.MultiNodeChainList(comm)
    m.add_link(part, None if r == 0 else r - 1, None if r == last else r + 1)
    if r == 0:
        return m, x, part
    if r == last:
        return L.Classifier(m), chainer.datasets.TupleDataset(t), part
    return m, mnpar.datasets.create_empty_dataset(chainer.datasets.TupleDataset(x, t)), part


def update_once(comm, make_updater):
    target, dataset, part = stage(comm)
    optimizer = chainer.optimizers.MomentumSGD(0.1).setup(target)
    it = chainer.iterators.SerialIterator(dataset, BATCH, shuffle=False)
    updater = make_updater(it, optimizer)
    reporter, observation = chainer.Reporter(), {}
    reporter.add_observer("main", target)
    with reporter.scope(observation):
        updater.update()
    updater.finalize()
    return [p.array.copy() for p in part.params()], observation.get("main/loss")


def main() -> None:
    comm = mnpar.create_communicator("naive", timeout=30)
    parts = layers(comm.size)
    whole = L.Classifier(chainer.Sequential(*parts))
    chainer.optimizers.MomentumSGD(0.1).setup(whole).update(whole, *data())
    single = [p.array for p in parts[comm.rank].params()]
    initial = [p.array for p in layers(comm.size)[comm.rank].params()]
    plain, _ = update_once(comm, lambda it, opt: chainer.training.StandardUpdater(it, opt))
    checked = []
    for schedule in TRAINING_SCHEDULES:
        for k in MICROBATCHES:
            piped, loss = update_once(comm, lambda it, opt, s=schedule, k=k: PipelineUpdater(
                it, opt, comm, k, schedule=s))
            assert len(piped) == len(plain) == len(single) == 2
            for a, b, c, before in zip(piped, plain, single, initial):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=schedule)
                np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-12, err_msg=schedule)
                assert not np.allclose(a, before), "the update changed nothing"
            if comm.rank == comm.size - 1:
                assert abs(float(loss) - float(whole.loss.array)) < 1e-12, loss
            checked.append([schedule, k])
    report(rank=comm.rank, checked=checked, params=len(single))
    comm.finalize()


if __name__ == "__main__":
    main()
