"""Group and layer normalization over pixels in a converted model, against one process.

``L.GroupNormalization`` (and ``F.group_normalization``) normalize each
sample's channel groups over all its pixels, ``L.LayerNormalization`` of a
flattened image over all its features: on tiles, the statistics come from
the whole grid, and every gradient (input, gamma, beta, the layers before)
is one process's (float64, 1e-10). Odd images, uneven tiles.
"""
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from spatial_twins import Body, on, same_as_one_process

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=1)
IMAGE = (2, 3, 9, 11)


GRIDS = [on((1, 1), 1), on((1, 2), 2), on((2, 1), 2), on((1, 3), 3), on((2, 2), 4)]


def group_norm_link():
    return Body(lambda s, x: F.relu(s.l1(s.l0(x))), L.Convolution2D(3, 4, 3, pad=1),
                L.GroupNormalization(2, 4))


def group_norm_function():
    return Body(lambda s, x: F.group_normalization(s.l0(x), 4, s.l1.gamma, s.l1.beta, 1e-3),
                L.Convolution2D(3, 4, 3, pad=1), L.GroupNormalization(4, 4))


def layer_norm():
    return Body(lambda s, x: s.l2(F.tanh(s.l1(F.reshape(s.l0(x), (len(x), -1))))),
                L.Convolution2D(3, 2, 3, pad=1), L.LayerNormalization(2 * 9 * 11),
                L.Linear(2 * 9 * 11, 3))


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("make", [group_norm_link, group_norm_function, layer_norm],
                         ids=["GroupNormalization", "F.group_normalization",
                              "LayerNormalization of a flattened image"])
def test_a_normalization_across_pixels_uses_the_whole_image(grid, make):
    x = np.random.RandomState(1).standard_normal(IMAGE) * 3 + 1
    same_as_one_process(grid, make, x)


@pytest.mark.parametrize("shape", [on((1, 2), 2)])
def test_mnpar_spatial_group_normalization_takes_tiles_outside_a_converted_model(grid):
    x = np.random.RandomState(1).standard_normal(IMAGE)
    gamma, beta = np.arange(1., 4.), np.arange(3.)
    y = S.group_normalization(grid.tile(x), 3, gamma, beta, grid=grid)
    np.testing.assert_allclose(y.array, grid.tile(F.group_normalization(x, 3, gamma, beta).array),
                               rtol=1e-10, atol=1e-10)
