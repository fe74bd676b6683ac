"""create_empty_dataset: the iterator, converter and updater call ``model()``."""
import chainer
import numpy as np
import pytest

import mnpar


def test_same_length_and_empty_examples():
    base = chainer.datasets.TupleDataset(np.arange(10.0), np.arange(10))
    empty = mnpar.datasets.create_empty_dataset(base)
    assert len(empty) == 10
    assert empty[0] == () and empty[-1] == ()
    assert empty[2:5] == [(), (), ()]
    with pytest.raises(IndexError, match="index 10 is out of range"):
        empty[10]


def test_rejects_a_dataset_without_length():
    with pytest.raises(TypeError, match="needs a dataset with a length, not generator"):
        mnpar.datasets.create_empty_dataset(x for x in range(3))


def test_updater_calls_the_model_with_no_arguments():
    calls = []

    class NoInput(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.w = chainer.Parameter(np.ones(1))

        def forward(self, *args):
            calls.append(args)
            return chainer.functions.sum(self.w * 2)

    model = NoInput()
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    data = mnpar.datasets.create_empty_dataset(list(range(6)))
    it = chainer.iterators.SerialIterator(data, 4, repeat=False, shuffle=False)
    updater = chainer.training.updaters.StandardUpdater(it, optimizer)
    updater.update()
    assert calls == [()]
    batch = chainer.dataset.concat_examples(data[:3])
    assert batch == ()
