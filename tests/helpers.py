"""What several test modules build the same way: components, tiny trainers, ChainerMN."""
import contextlib
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import mnpar


@contextlib.contextmanager
def without_cupy():
    """mnpar as it runs where cupy is not installed, on any machine."""
    from mnpar import _arrays

    saved, _arrays._cupy = _arrays._cupy, None
    try:
        yield
    finally:
        _arrays._cupy = saved


class FakeGpuArray(np.ndarray):
    """Stands for a cupy array on a sending rank (``is_cupy_array`` patched to see it)."""

    def get(self):
        return np.array(self)


def chainermn_and_comm():
    """ChainerMN (the peer mnpar ports from) and a naive communicator of its.

    Tests that use it carry the ``chainermn`` marker (tests/conftest.py); one
    that does not is skipped here with the marker's reason.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import chainermn
        except ImportError as e:
            pytest.skip(f"needs chainermn ({e})")
        return chainermn, chainermn.create_communicator("naive")


class Fn(chainer.Chain):
    """A component: ``fn(self, *args)`` over the given child links."""

    def __init__(self, fn, **links):
        super().__init__()
        with self.init_scope():
            for name, link in links.items():
                setattr(self, name, link)
        self.fn = fn

    def forward(self, *args):
        return self.fn(self, *args)


def float64(link):
    """``link`` with every parameter cast to float64, the dtype transparency tests compare in."""
    for param in link.params():
        param.array = param.array.astype(np.float64)
    return link


def unpipelined(target):
    """The loss of ``target`` run by a plain updater; on a rank outside the model (an
    empty ``MultiNodeChainList``), a zero loss."""
    def loss(*args):
        if isinstance(target, mnpar.MultiNodeChainList) and len(target) == 0:
            return chainer.Variable(np.zeros(()))
        return target(*args)
    return loss


class Dense(chainer.Chain):
    """A Linear layer (weights drawn from N(0, 0.5), numpy's global seed) and a ReLU."""

    def __init__(self, n_in, n_out, relu=True):
        super().__init__()
        self.relu = relu
        with self.init_scope():
            self.l = L.Linear(n_in, n_out, initialW=chainer.initializers.Normal(0.5))

    def forward(self, x):
        h = self.l(x)
        return F.relu(h) if self.relu else h


class Identity(chainer.Chain):
    """A component that passes its input on, e.g. to the loss on the first rank."""

    def forward(self, y):
        return y


def tiny_trainer(out, stop, batch_size=4, init_seed=0):
    """A linear classifier on 24 fixed random points, trained for ``stop`` iterations.

    ``init_seed`` seeds the weights; the data and the (resumable) shuffling
    are always the same.
    """
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (24, 3)).astype(np.float32)
    t = (x.sum(axis=1) > 0).astype(np.int32)
    np.random.seed(init_seed)
    model = L.Classifier(L.Linear(3, 2))
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    it = chainer.iterators.SerialIterator(
        chainer.datasets.TupleDataset(x, t), batch_size,
        order_sampler=mnpar.extensions.ResumableShuffleOrderSampler(0))
    updater = chainer.training.updaters.StandardUpdater(it, optimizer)
    return chainer.training.Trainer(updater, (stop, "iteration"), out=str(out))
