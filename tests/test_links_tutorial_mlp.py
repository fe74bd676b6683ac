"""The ChainerMN tutorial's MLP, ported by changing ``chainermn`` to ``mnpar``.

The model classes are the tutorial's (old-style ``Chain.__init__(**links)``
included); one epoch runs through chainer's Trainer with an Evaluator, whose
forwards (``train=False``, no backprop) must never wait for a backward.
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from chainer import training

import mnpar as chainermn

pytestmark = pytest.mark.mpi(min_size=2)


class MLP0SubA(chainer.Chain):
    def __init__(self, comm, n_out):
        super().__init__(l1=L.Linear(784, n_out))

    def __call__(self, x):
        return F.relu(self.l1(x))


class MLP0SubB(chainer.Chain):
    def __init__(self, comm):
        super().__init__()

    def __call__(self, y):
        return y


class MLP0(chainermn.MultiNodeChainList):
    def __init__(self, comm, n_out):
        super().__init__(comm=comm)
        self.add_link(MLP0SubA(comm, n_out), rank_in=None, rank_out=1)
        self.add_link(MLP0SubB(comm), rank_in=1, rank_out=None)


class MLP1Sub(chainer.Chain):
    def __init__(self, n_units, n_out):
        super().__init__(l2=L.Linear(None, n_units), l3=L.Linear(None, n_out))

    def __call__(self, h0):
        h1 = F.relu(self.l2(h0))
        return self.l3(h1)


class MLP1(chainermn.MultiNodeChainList):
    def __init__(self, comm, n_units, n_out):
        super().__init__(comm=comm)
        self.add_link(MLP1Sub(n_units, n_out), rank_in=0, rank_out=0)


def test_tutorial_mlp_trains_with_trainer_and_evaluator():
    comm = chainermn.create_communicator("naive", timeout=20)
    try:
        rng = np.random.RandomState(0)
        x = rng.rand(64, 784).astype(np.float32)
        t = (x[:, :10].argmax(axis=1)).astype(np.int32)
        train = chainer.datasets.TupleDataset(x[:48], t[:48])
        test = chainer.datasets.TupleDataset(x[48:], t[48:])
        if comm.rank == 0:
            model = L.Classifier(MLP0(comm, 20))
        elif comm.rank == 1:
            model = MLP1(comm, 20, 10)
        else:
            model = chainermn.MultiNodeChainList(comm)  # an idle rank
        if comm.rank != 0:
            train = chainermn.datasets.create_empty_dataset(train)
            test = chainermn.datasets.create_empty_dataset(test)
        optimizer = chainer.optimizers.Adam()
        optimizer.setup(model)
        train_iter = chainer.iterators.SerialIterator(train, 16, shuffle=False)
        test_iter = chainer.iterators.SerialIterator(test, 16, repeat=False, shuffle=False)
        updater = training.StandardUpdater(train_iter, optimizer)
        trainer = training.Trainer(updater, (2, "epoch"))
        trainer.extend(training.extensions.Evaluator(test_iter, model), trigger=(1, "epoch"))
        log = training.extensions.LogReport(trigger=(1, "epoch"))
        trainer.extend(log)
        if comm.rank > 1:
            assert model() is None  # nothing to train; it still tells the others its wiring
            return
        trainer.run()
        assert updater.iteration == 6
        if comm.rank == 0:
            losses = [entry["main/loss"] for entry in log.log]
            assert len(losses) == 2 and np.isfinite(losses).all()
            assert "validation/main/loss" in log.log[-1]
    finally:
        comm.finalize()
