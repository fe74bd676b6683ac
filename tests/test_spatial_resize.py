"""``F.resize_images`` in a converted model, in global coordinates, against one process.

Each rank's output rows read a band of input rows that may lie on other
ranks; the weights and the arithmetic are chainer's, so the result is
chainer's to float32 rounding (chainer's resize takes float32 only). The
spatial version computes chainer's coordinates itself, without the
``numpy.float`` that chainer 7.8.1's own uses (the one-process reference
runs through the compatibility layer on numpy 1.24 and later).
"""
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from spatial_twins import GRIDS, Body, on, same_as_one_process

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=1)
IMAGE = (2, 3, 9, 11)


CASES = {
    "up, align_corners": dict(output_shape=(17, 23)),
    "down, align_corners": dict(output_shape=(5, 7)),
    "up and down, half pixels": dict(output_shape=(13, 4), align_corners=False),
    "to a few rows per rank": dict(output_shape=(4, 3), align_corners=False),
    "nearest": dict(output_shape=(14, 19), mode="nearest"),
}


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_resize_images_is_one_processes(grid, case):
    kwargs = CASES[case]
    x = np.random.RandomState(1).standard_normal(IMAGE)
    make = lambda: Body(lambda s, x: s.l1(F.resize_images(s.l0(x), **kwargs)),  # noqa: E731
                        L.Convolution2D(3, 4, 3, pad=1),
                        L.Scale(axis=1, W_shape=(4,), bias_term=True))
    same_as_one_process(grid, make, x, dtype=np.float32, tol=2e-5)


@pytest.mark.parametrize("shape", [on((1, 2), 2)])
def test_mnpar_spatial_resize_images_takes_tiles_outside_a_converted_model(grid):
    x = np.random.RandomState(1).standard_normal(IMAGE).astype(np.float32)
    y = S.resize_images(grid.tile(x), (6, 15), grid=grid)
    np.testing.assert_allclose(y.array, grid.tile(F.resize_images(x, (6, 15)).array),
                               rtol=1e-5, atol=1e-5)
