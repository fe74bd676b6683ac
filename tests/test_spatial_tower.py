"""The tower: a fully connected layer on tiles, against one process.

Chainer's ``L.Linear`` after the convolutions, converted, keeps only its
tile's columns of ``W`` and sums the partial products; ``F.linear`` on a
flattened tile sums them with the whole ``W``. Outputs, the input's
gradient and every parameter's gradient are one process's (a cut ``W``'s:
its columns of one process's), float64.
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from spatial_twins import Body, agree, on, same_as_one_process

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=1)
IMAGE = (2, 3, 9, 11)


GRIDS = [on((1, 1), 1), on((1, 2), 2), on((2, 1), 2), on((1, 3), 3), on((2, 2), 4)]

MODELS = {
    "Linear(None) on the tile": lambda: Body(lambda s, x: s.l1(F.relu(s.l0(x))),
                                             L.Convolution2D(3, 4, 3, pad=1), L.Linear(None, 5)),
    "Linear on the flattened tile": lambda: Body(
        lambda s, x: s.l2(F.tanh(s.l1(F.reshape(s.l0(x), (len(x), -1))))),
        L.Convolution2D(3, 4, 3, pad=1), L.Linear(4 * 9 * 11, 6), L.Linear(6, 2)),
    "F.linear with the whole W": lambda: Body(
        lambda s, x: F.linear(s.l0(x), s.l1.W, s.l1.b), L.Convolution2D(3, 2, 3, pad=1),
        L.Linear(2 * 9 * 11, 3)),
    "Linear after a pooling": lambda: Body(
        lambda s, x: s.l1(F.max_pooling_2d(s.l0(x), 2)), L.Convolution2D(3, 4, 3, pad=1),
        L.Linear(4 * 5 * 6, 3, nobias=True)),
}


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("model", list(MODELS), ids=list(MODELS))
def test_a_tower_linear_sums_partial_products_as_one_process(grid, shape, model):
    x = np.random.RandomState(1).standard_normal(IMAGE)
    _, ours = same_as_one_process(grid, MODELS[model], x, tiled=False)
    if model == "Linear(None) on the tile":
        rows, cols = grid.tile_slices((9, 11))
        assert ours.l1.W.shape == (5, 4 * (rows.stop - rows.start) * (cols.stop - cols.start))
        assert S.shard_grid(ours.l1.W) is grid and S.shard_grid(ours.l1.b) is None


@pytest.mark.parametrize("shape", [on((1, 2), 2), on((2, 2), 4)])
def test_updates_of_a_cut_linear_are_one_processes(grid):
    make = MODELS["Linear(None) on the tile"]
    models = []
    for _ in range(2):
        np.random.seed(0)
        with chainer.using_config("dtype", np.float64):
            models.append(make())
    ref, ours = models
    S.convert(ours, grid)
    opts = [chainer.optimizers.Adam(0.01).setup(m) for m in (ref, ours)]
    for step in range(3):
        rng = np.random.RandomState(step)
        x, t = rng.standard_normal(IMAGE), rng.randint(0, 5, 2).astype(np.int32)
        for model, opt, data in ((ref, opts[0], x), (ours, opts[1], grid.tile(x))):
            np.random.seed(7)
            with chainer.using_config("dtype", np.float64):
                loss = F.softmax_cross_entropy(model(data), t)
            model.cleargrads()
            loss.backward()
            opt.update()
    rows, cols = grid.tile_slices((9, 11))
    whole = ref.l1.W.array.reshape(5, 4, 9, 11)[:, :, rows, cols].reshape(5, -1)
    failures = [] if np.allclose(ours.l1.W.array, whole, rtol=1e-10, atol=1e-10) else ["W"]
    failures += [] if np.allclose(ours.l0.W.array, ref.l0.W.array, rtol=1e-10, atol=1e-10) \
        else ["conv W"]
    agree(grid, failures)


@pytest.mark.parametrize("shape", [on((1, 2), 2)])
def test_mnpar_spatial_linear_on_tiles_outside_a_converted_model(grid):
    x = np.random.RandomState(1).standard_normal(IMAGE)
    np.random.seed(0)
    ref = L.Linear(3 * 9 * 11, 4)
    np.random.seed(0)
    fc = S.Linear(3 * 9 * 11, 4, grid=grid)
    y = fc(grid.tile(x.astype(np.float32)))
    np.testing.assert_allclose(y.array, ref(x.astype(np.float32)).array, rtol=1e-5, atol=1e-5)
    with pytest.raises(S.SpatialError, match="holds only this rank's part of its weights"):
        fc(np.ones((2, 4), np.float32))
