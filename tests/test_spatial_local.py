"""Local filtering on tiles: ``L.LocalConvolution2D`` cut by output pixel, against one process.

The converted link keeps its output tile's filters only; its output, the
input's gradient and its filters' gradients are one process's (float64).
Chainer 7.8.1's link sizes its weights ignoring the stride (its own forward
fails for stride > 1), so the link runs at stride 1 and ``F.local_convolution_2d``
with weights of the right shape at stride 2.
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from spatial_twins import GRIDS, Body, on, same_as_one_process

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=1)
IMAGE = (2, 3, 9, 11)


class Filters(chainer.Link):
    """Weights of a local convolution, whole, for ``F.local_convolution_2d``."""

    def __init__(self, out_hw, k):
        super().__init__()
        with self.init_scope():
            self.W = chainer.Parameter(np.random.standard_normal((2,) + out_hw + (4, k, k)))
            self.b = chainer.Parameter(np.random.standard_normal((2,) + out_hw))


MODELS = {
    "link, size known": lambda: Body(lambda s, x: F.relu(s.l1(s.l0(x))),
                                     L.Convolution2D(3, 4, 3, pad=1),
                                     L.LocalConvolution2D(4, 2, (9, 11), 3)),
    "link, size drawn at the first forward": lambda: Body(
        lambda s, x: s.l1(s.l0(x)), L.Convolution2D(3, 4, 3, pad=1),
        L.LocalConvolution2D(None, 2, None, 2, nobias=True)),
    "function, stride 2": lambda: Body(
        lambda s, x: F.local_convolution_2d(s.l0(x), s.l1.W, s.l1.b, 2),
        L.Convolution2D(3, 4, 3, pad=1), Filters((4, 5), 3)),
}


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("model", list(MODELS), ids=list(MODELS))
def test_local_filtering_on_tiles_is_one_processes(grid, shape, model):
    x = np.random.RandomState(1).standard_normal(IMAGE)
    _, ours = same_as_one_process(grid, MODELS[model], x)
    if model == "link, size known":
        rows, cols = grid.tile_slices((7, 9))
        assert ours.l1.W.shape == (2, rows.stop - rows.start, cols.stop - cols.start, 4, 3, 3)
        assert ours.l1.b.shape == (2, rows.stop - rows.start, cols.stop - cols.start)
        assert S.shard_grid(ours.l1.W) is grid and S.shard_grid(ours.l0.W) is None


@pytest.mark.parametrize("shape", [on((1, 2), 2)])
def test_mnpar_spatial_local_convolution_2d_outside_a_converted_model(grid):
    x = np.random.RandomState(1).standard_normal((1, 2, 6, 8)).astype(np.float32)
    np.random.seed(0)
    ref = L.LocalConvolution2D(2, 3, (6, 8), 3)
    np.random.seed(0)
    ours = S.LocalConvolution2D(2, 3, (6, 8), 3, grid=grid)
    rows, cols = grid.tile_slices((4, 6))
    np.testing.assert_array_equal(ours.W.array, ref.W.array[:, rows, cols])
    np.testing.assert_allclose(ours(grid.tile(x)).array, grid.tile(ref(x).array), rtol=1e-5,
                               atol=1e-5)
