"""Weights cut by pixel through snapshots: each rank saves and resumes its own part.

A converted model with a local convolution and a tower Linear trains 4
iterations straight, and again with a snapshot at iteration 2 resumed into
a fresh trainer (other initial weights): the parameters and the optimizer's
state must come out the same bit for bit. A rank that loads another rank's
snapshot is an error on every rank before anything is computed.
"""
import os
import shutil
import tempfile

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from spatial_twins import on

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=1)
IMAGES = (12, 2, 8, 10)


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.local = L.LocalConvolution2D(2, 3, (8, 10), 3)
            self.fc = L.Linear(3 * 6 * 8, 4)

    def forward(self, x):
        return self.fc(F.relu(self.local(x)))


def trainer(grid, out, stop, seed):
    np.random.seed(seed)
    model = L.Classifier(S.convert(Net(), grid))
    optimizer = chainer.optimizers.Adam(0.01).setup(model)
    rng = np.random.RandomState(0)
    x = rng.standard_normal(IMAGES).astype(np.float32)
    t = rng.randint(0, 4, IMAGES[0]).astype(np.int32)
    data = S.TiledDataset(chainer.datasets.TupleDataset(x, t), grid)
    it = chainer.iterators.SerialIterator(
        data, 3, order_sampler=mnpar.extensions.ResumableShuffleOrderSampler(0))
    updater = chainer.training.updaters.StandardUpdater(it, optimizer)
    return chainer.training.Trainer(updater, (stop, "iteration"), out=str(out))


def state(trainer):
    model = trainer.updater.get_optimizer("main").target
    out = {name: p.array.copy() for name, p in model.namedparams()}
    for name, p in model.namedparams():
        for key, value in p.update_rule.state.items():
            out[f"{name}/{key}"] = value.copy()
    return out


@pytest.mark.parametrize("shape", [on((1, 1), 1), on((1, 2), 2), on((2, 2), 4)])
def test_a_resumed_trainer_holds_the_same_shards_as_an_uninterrupted_one(grid, tmp_path,
                                                                         shape):
    comm = grid.spatial_comm
    whole = trainer(grid, tmp_path / "whole", 4, seed=0)
    whole.extend(mnpar.extensions.snapshot(comm, n_retains=None, trigger=(2, "iteration")))
    whole.run()
    resumed = trainer(grid, tmp_path / "resumed", 4, seed=1)
    assert mnpar.extensions.resume(comm, resumed, str(tmp_path / "whole"), iteration=2) == 2
    resumed.run()
    expected, got = state(whole), state(resumed)
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
    model = resumed.updater.get_optimizer("main").target.predictor
    rows, cols = grid.tile_slices((6, 8))
    assert model.local.W.shape == (3, rows.stop - rows.start, cols.stop - cols.start, 2, 3, 3)
    assert S.shard_grid(model.fc.W) is grid


@pytest.mark.parametrize("shape", [on((1, 2), 2)])
def test_a_rank_that_loads_another_ranks_shards_is_an_error_on_every_rank(grid):
    directory = grid.mpi.bcast(tempfile.mkdtemp() if grid.rank == 0 else None)
    x = np.random.RandomState(0).standard_normal((2, 2, 8, 10)).astype(np.float32)
    np.random.seed(0)
    model = S.convert(Net(), grid)
    model(grid.tile(x))
    chainer.serializers.save_npz(os.path.join(directory, f"{grid.rank}.npz"), model)
    grid.mpi.Barrier()
    other = (grid.rank + 1) % grid.size if grid.rank == 0 else grid.rank
    np.random.seed(0)
    fresh = S.convert(Net(), grid)
    chainer.serializers.load_npz(os.path.join(directory, f"{other}.npz"), fresh)
    try:
        with pytest.raises(S.SpatialError, match=r"spatial local convolution 'local': the ranks "
                           r"of the grid pass different arguments .*; a rank holds another "
                           "rank's part of the weights"):
            fresh(grid.tile(x))
    finally:
        grid.mpi.Barrier()
        if grid.rank == 0:
            shutil.rmtree(directory)


@pytest.mark.parametrize("shape", [on((1, 1), 1), on((1, 2), 2), on((2, 2), 4)])
def test_gradient_clipping_by_the_whole_models_norm_counts_cut_weights_and_replicas_once(
        grid):
    # Cut weights are pieces (their squares summed over the grid), every other parameter
    # the same on every rank (counted once): the norm and the updates are one process's.
    x = np.random.RandomState(0).standard_normal((4, 2, 8, 10))
    t = np.random.RandomState(1).randint(0, 4, 4).astype(np.int32)
    models = []
    for _ in range(2):
        np.random.seed(0)
        with chainer.using_config("dtype", np.float64):
            models.append(L.Classifier(Net()))
    ref, ours = models
    S.convert(ours.predictor, grid)
    ref_opt = chainer.optimizers.SGD(0.1).setup(ref)
    ref_opt.add_hook(chainer.optimizer_hooks.GradientClipping(0.5))
    opt = chainer.optimizers.SGD(0.1).setup(ours)
    hook = mnpar.optimizer_hooks.GradientClipping(grid.spatial_comm, 0.5)
    opt.add_hook(hook)
    for _ in range(2):
        ref_opt.update(ref, x, t)
        opt.update(ours, grid.tile(x), t)
    clipped = np.sqrt(sum(float((p.grad ** 2).sum()) for p in ref.params()))
    assert hook.norm > 0.5 and clipped == pytest.approx(0.5)  # both clipped
    rows, cols = grid.tile_slices((6, 8))
    local = ours.predictor.local
    np.testing.assert_allclose(local.W.array, ref.predictor.local.W.array[:, rows, cols],
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.predictor.fc.b.array, ref.predictor.fc.b.array,
                               rtol=1e-10, atol=1e-12)
