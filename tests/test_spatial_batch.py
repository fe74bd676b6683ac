"""From tiles to whole images of a share of the batch and back, in a converted model.

After ``spatial_to_batch`` chainer's own per-sample layers run on each
rank's samples (data parallel inside the grid): their outputs, the
gradients of the layers before and the parameters' (summed over the grid)
are one process's (float64).
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from spatial_twins import Body, converted, on, same_as_one_process

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=1)
IMAGE = (5, 3, 9, 11)  # five samples: uneven shares over 2, 3 and 4 ranks


GRIDS = [on((1, 1), 1), on((1, 2), 2), on((2, 1), 2), on((1, 3), 3), on((2, 2), 4)]


def spatial(s):
    return hasattr(s, "_spatial")


def to_batch(s, h):
    return S.spatial_to_batch(h, s._spatial[0]) if spatial(s) else h


def to_spatial(s, h):
    return S.batch_to_spatial(h, s._spatial[0]) if spatial(s) else h


def whole_batch(s, h):
    return S.gather_batch(h, s._spatial[0]) if spatial(s) else h


MODELS = {
    "a classifier head on each rank's samples": lambda: Body(
        lambda s, x: whole_batch(s, s.l3(F.max_pooling_2d(F.relu(s.l2(s.l1(to_batch(
            s, s.l0(x))))), 2))),
        L.Convolution2D(3, 4, 3, pad=1), L.Convolution2D(4, 4, 3, pad=1),
        L.Scale(axis=1, W_shape=(4,)), L.Linear(None, 5)),
    "a batch mean and back to tiles": lambda: Body(
        lambda s, x: s.l1(to_spatial(s, (lambda h: h - F.mean(h, axis=0, keepdims=True))(
            to_batch(s, s.l0(x))))),
        L.Convolution2D(3, 4, 3, pad=1), L.Convolution2D(4, 2, 3, pad=1)),
}


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("model", list(MODELS), ids=list(MODELS))
def test_per_sample_layers_on_each_ranks_share_are_one_processes(grid, model):
    x = np.random.RandomState(1).standard_normal(IMAGE)
    same_as_one_process(grid, MODELS[model], x)


@pytest.mark.parametrize("shape", [on((1, 2), 2), on((2, 2), 4)])
def test_a_function_that_mixes_samples_is_refused_on_batch_shares(grid):
    model = converted(grid, lambda: Body(lambda s, x: s.l1(to_batch(s, s.l0(x))),
                                         L.Convolution2D(3, 4, 3, pad=1),
                                         L.BatchNormalization(4)))
    with pytest.raises(S.SpatialError, match=r"F.batch_normalization \(BatchNormalization\) "
                       "in layer '/l1' .* cannot run on tiles of the spatial grid"):
        model(grid.tile(np.random.RandomState(1).standard_normal(IMAGE)))


@pytest.mark.parametrize("shape", [on((2, 2), 4)])
def test_fewer_samples_than_ranks_is_an_error_on_every_rank(grid):
    x = np.ones((3, 1, 4, 4), np.float32)
    with pytest.raises(S.SpatialError, match="spatial_to_batch: a batch of 3 for the 4 ranks"):
        S.spatial_to_batch(grid.tile(x), grid)


@pytest.mark.parametrize("shape", [on((1, 2), 2)])
def test_spatial_to_batch_and_back_outside_a_converted_model(grid, shape):
    x = np.random.RandomState(0).standard_normal(IMAGE)
    share = S.spatial_to_batch(chainer.Variable(grid.tile(x)), grid)
    first = 0 if grid.rank == 0 else (IMAGE[0] + 1) // 2
    np.testing.assert_array_equal(share.array, x[first:first + share.shape[0]])
    np.testing.assert_array_equal(S.batch_to_spatial(share, grid).array, grid.tile(x))
    np.testing.assert_array_equal(S.gather_batch(share, grid).array, x)
