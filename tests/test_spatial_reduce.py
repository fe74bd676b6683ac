"""Reductions over the split axes and global pooling in a converted model, against one process.

``F.sum``, ``F.mean``, ``F.average``, ``F.max`` and ``F.min`` over every
split axis, and pooling whose one window is the whole image, are one
allreduce; the result, and every parameter's gradient, is one process's
(float64, 1e-10). The images are odd (9 x 11), so the tiles differ in size;
the max pooling cases put ties in the window (ReLU zeros), where chainer
sends the gradient to the first maximum.
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
IMAGE = (2, 3, 9, 11)


GRIDS = [on((1, 1), 1), on((1, 2), 2), on((2, 1), 2), on((1, 3), 3), on((2, 2), 4)]


def head(fn):
    """A convolution and a scale (parameters before and after the tiles), then ``fn``."""
    return lambda: Body(lambda s, x: fn(s.l1(s.l0(x))), L.Convolution2D(3, 4, 3, pad=1),
                        L.Scale(axis=1, W_shape=(4,), bias_term=True))


CASES = {
    "sum over all": lambda h: F.sum(h),
    "sum over N, H, W": lambda h: F.sum(h, axis=(0, 2, 3)),
    "sum keepdims times the tile": lambda h: h * F.sum(h, axis=(2, 3), keepdims=True),
    "mean over H, W (global average pooling)": lambda h: F.mean(h, axis=(2, 3)),
    "average over -1, -2": lambda h: F.average(h, axis=(-1, -2)),
    "mean of squares, centred": lambda h: h - F.mean(h * h, axis=(0, 2, 3), keepdims=True),
    "max over H, W": lambda h: F.max(h, axis=(2, 3)),
    "max keepdims times the tile": lambda h: h * F.max(h, axis=(1, 2, 3), keepdims=True),
    "min over all": lambda h: F.min(h),
    "max of ReLU (ties)": lambda h: F.max(F.relu(h - 2), axis=(2, 3)),
    "global average pooling": lambda h: F.average_pooling_2d(h, (9, 11)),
    "global average pooling, padded": lambda h: F.average_pooling_2d(h, (11, 13), pad=1),
    "global max pooling": lambda h: F.max_pooling_2d(h, (9, 11)),
    "global max pooling of ReLU (ties)": lambda h: F.max_pooling_2d(F.relu(h - 1.5), (9, 11)),
    "global max pooling, a longer stride": lambda h: F.max_pooling_2d(h, (9, 11), stride=20),
    "global average pooling nd, pad_value None": lambda h: F.average_pooling_nd(
        h, (9, 11), pad_value=None),
}


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_reduction_over_the_split_axes_is_the_whole_images(grid, case):
    x = np.random.RandomState(1).standard_normal(IMAGE)
    same_as_one_process(grid, head(CASES[case]), x)


@pytest.mark.parametrize("shape", [on((1, 2), 2), on((2, 2), 4)])
def test_a_reduction_over_some_split_axes_is_refused_on_every_rank(grid):
    model = converted(grid, head(lambda h: F.sum(h, axis=3)))
    x = np.random.RandomState(1).standard_normal(IMAGE)
    with pytest.raises(S.SpatialError, match=r"F.sum \(Sum\) in the forward of Body cannot run "
                       r"on tiles of the spatial grid: it reduces over some of the split axes "
                       r"\(2, 3\) but not \[2\].*axis=\(2, 3\)"):
        model(grid.tile(x))


@pytest.mark.parametrize("shape", [on((1, 2), 2), on((2, 2), 4)])
def test_a_pooling_size_read_from_the_tiles_shape_is_an_error_on_every_rank(grid, shape):
    # The bug: F.average_pooling_2d(h, h.shape[2:]) reads the tile's size, which differs
    # from rank to rank on uneven tiles; each rank pooled its own window.
    model = converted(grid, head(lambda h: F.average_pooling_2d(h, h.shape[2:])))
    x = np.random.RandomState(1).standard_normal(IMAGE)
    with pytest.raises(S.SpatialError, match=r"spatial average pooling: the ranks of the grid "
                       r"pass different arguments .*; a size read from a tile's shape \(h.shape\) "
                       r"is the tile's"):
        model(grid.tile(x))


@pytest.mark.parametrize("shape", [on((1, 2), 2)])
def test_weights_along_a_split_axis_are_refused(grid):
    w = np.arange(11, dtype=np.float64)
    model = converted(grid, head(lambda h: F.average(h, axis=3, weights=w)))
    with pytest.raises(S.SpatialError, match="F.average with weights in the forward of Body "
                       "cannot run on tiles of the spatial grid: the weights run along split "
                       r"axis \[3\]"):
        model(grid.tile(np.random.RandomState(1).standard_normal(IMAGE)))


@pytest.mark.parametrize("shape", [on((1, 2), 2), on((2, 1), 2)])
def test_a_global_pooling_with_weights_along_the_free_axis_is_exact(grid):
    x = np.random.RandomState(1).standard_normal(IMAGE)
    same_as_one_process(grid, head(lambda h: F.average(h, axis=1, weights=np.arange(1., 5.))),
                        x)
    with chainer.using_config("train", False):
        same_as_one_process(grid, head(lambda h: F.mean(F.relu(h))), x)
