"""Replicas and data checked at the end of a converted forward, on every rank.

Replicas built from different seeds, labels that differ across the grid,
and iterators that read different examples for one batch would train on
silently; each is a ``SpatialError`` on every rank naming what differs.
"""
import chainer
import chainer.links as L
import numpy as np
import pytest
from spatial_twins import on

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=2)
IMAGES = (8, 2, 6, 8)


GRIDS = [on((1, 2), 2), on((2, 2), 4)]


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(2, 3, 3, pad=1)
            self.fc = L.Linear(None, 4)

    def forward(self, x):
        return self.fc(self.conv(x))


def data(grid):
    rng = np.random.RandomState(0)
    x = rng.standard_normal(IMAGES).astype(np.float32)
    t = rng.randint(0, 4, IMAGES[0]).astype(np.int32)
    return x, t


@pytest.mark.parametrize("shape", GRIDS)
def test_replicas_from_different_seeds_are_an_error_on_every_rank(grid):
    np.random.seed(1 if grid.rank == 1 else 0)
    model = S.convert(Net(), grid)
    x, _ = data(grid)
    with pytest.raises(S.SpatialError, match=r"the parameters of Net differ across the grid "
                       r"\(ranks \[0(, 2, 3)?\] agree / ranks \[1\] agree\); the first that "
                       r"differs is '/conv/W'.*np.random.seed before it"):
        model(grid.tile(x))


@pytest.mark.parametrize("shape", GRIDS)
def test_the_same_replicas_and_data_pass_and_are_checked_once(grid):
    np.random.seed(0)
    model = L.Classifier(S.convert(Net(), grid))
    x, t = data(grid)
    model(grid.tile(x[:2]), t[:2])
    model.predictor.conv.b.array += grid.rank  # after the first forward: not checked again
    model(grid.tile(x[:2]), t[:2])


@pytest.mark.parametrize("shape", GRIDS)
def test_labels_that_differ_across_the_grid_are_an_error_on_every_rank(grid):
    np.random.seed(0)
    model = S.convert(L.Classifier(Net()), grid)
    x, t = data(grid)
    labels = t[:2] if grid.rank != 1 else t[2:4]
    with pytest.raises(S.SpatialError, match=r"the ranks of the grid called Classifier with "
                       r"different arguments that are not tiles \(labels\?\)"):
        model(grid.tile(x[:2]), labels)


@pytest.mark.parametrize("shape", GRIDS)
def test_iterators_that_read_other_examples_are_an_error_on_every_rank(grid):
    # The bug: a shuffle seeded per rank gave each rank tiles of other images.
    np.random.seed(0)
    model = L.Classifier(S.convert(Net(), grid))
    x, t = data(grid)
    train = S.TiledDataset(chainer.datasets.TupleDataset(x, t), grid)
    it = chainer.iterators.SerialIterator(
        train, 2, order_sampler=mnpar.extensions.ResumableShuffleOrderSampler(int(grid.rank == 1)))
    batch = chainer.dataset.concat_examples(it.next())
    with pytest.raises(S.SpatialError, match=r"the ranks of the grid read different examples "
                       r"for this batch: .*their tiles are not tiles of the same images"):
        model(*batch)
