"""Sharding over the data axis of a mesh composes with the other splits.

On 4 ranks, ``mnpar.Mesh(world, data=2, <axis>=2)``; every stage's sharded
optimizer over ``mesh.comm("data")`` against plain data parallelism over the
same communicator, which the other splits' own tests hold equal to one
process (float64, to 1e-12: stage 3 reduces each micro-batch apart):

* pipeline: a MultiNodeChainList (A, C on pipeline rank 0; B on 1) under
  ``PipelineUpdater`` (1f1b and gpipe, 2 micro-batches), and called directly;
* spatial: a converted CNN whose tiles lie on the spatial axis.
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from helpers import Dense, float64
from sharded_models import assert_matches

import mnpar
from mnpar.optimizer_hooks import GradientClipping
from mnpar.pipeline import PipelineUpdater

pytestmark = pytest.mark.mpi(min_size=4)
TOL = dict(rtol=1e-12, atol=1e-13)
ROWS = 4


@pytest.fixture(scope="module")
def world():
    c = mnpar.create_communicator("naive", timeout=30)
    sub = c.split(int(c.rank >= 4), c.rank)
    yield sub if c.rank < 4 else None
    sub.finalize()
    c.finalize()


@pytest.fixture(scope="module")
def pipeline_mesh(world):
    if world is None:
        yield None
        return
    mesh = mnpar.Mesh(world, data=2, pipeline=2)
    yield mesh
    mesh.free()


@pytest.fixture(scope="module")
def spatial_mesh(world):
    if world is None:
        yield None
        return
    mesh = mnpar.Mesh(world, data=2, spatial=2)
    yield mesh
    mesh.free()


def pieces(mesh):
    """This rank's piece of A -> B -> C (seeded float64) and its own parts."""
    np.random.seed(7)
    parts = [float64(p) for p in (Dense(6, 8), Dense(8, 7), Dense(7, 4, relu=False))]
    model = mnpar.MultiNodeChainList(mesh.comm("pipeline"))
    if mesh.rank("pipeline") == 0:
        model.add_link(parts[0], None, 1)
        model.add_link(parts[2], 1, None)
        return L.Classifier(model)
    model.add_link(parts[1], 0, 0)
    return model


def rows(mesh, step):
    """This data replica's rows of ``step``."""
    rng = np.random.RandomState(10 + step)
    x, t = rng.randn(2 * ROWS, 6), rng.randint(0, 4, 2 * ROWS).astype(np.int32)
    d = mesh.rank("data")
    return x[d * ROWS:(d + 1) * ROWS], t[d * ROWS:(d + 1) * ROWS]


def pipelined(mesh, stage, schedule, clip):
    target = pieces(mesh)
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01),
                                            mesh.comm("data"), stage=stage).setup(target)
    if clip:  # the whole model's norm: pieces over the pipeline axis (copies or shards
        opt.add_hook(GradientClipping(mesh.comm("pipeline"), 0.05))  # over the data axis)
    x, t = zip(*(rows(mesh, s) for s in range(2)))
    data = (chainer.datasets.TupleDataset(np.concatenate(x), np.concatenate(t))
            if mesh.rank("pipeline") == 0 else
            mnpar.datasets.create_empty_dataset(range(2 * ROWS)))
    it = chainer.iterators.SerialIterator(data, ROWS, shuffle=False)
    updater = PipelineUpdater(it, opt, mesh.comm("pipeline"), 2, schedule=schedule)
    for _ in range(2):
        updater.update()
    updater.finalize()
    return target, opt


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_pipeline_stages_sharded_over_the_data_axis(pipeline_mesh, stage, schedule, clip):
    if pipeline_mesh is None:
        return
    ref, _ = pipelined(pipeline_mesh, 0, schedule, clip)
    _, opt = pipelined(pipeline_mesh, stage, schedule, clip)
    assert_matches(opt, ref, False, **TOL)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_model_parallel_pieces_called_directly(pipeline_mesh, stage):
    if pipeline_mesh is None:
        return
    models = []
    for s in (0, stage):
        target = pieces(pipeline_mesh)
        opt = mnpar.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(0.1),
                                                pipeline_mesh.comm("data"), stage=s)
        opt.setup(target)
        for step in range(2):
            if pipeline_mesh.rank("pipeline") == 0:
                opt.update(target, *rows(pipeline_mesh, step))
            else:
                opt.update(target)
        models.append((target, opt))
    assert_matches(models[1][1], models[0][0], False, **TOL)


class ConvNet(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(2, 3, 3, pad=1)
            self.c2 = L.Convolution2D(3, 2, 3, pad=1)

    def forward(self, x):
        return self.c2(F.relu(self.c1(x)))


def spatial_run(mesh, stage):
    grid = mnpar.spatial.SpatialGrid(mesh.comm("spatial"), (1, 2))
    np.random.seed(3)
    model = mnpar.spatial.convert(float64(ConvNet()), grid)
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01),
                                            mesh.comm("data"), stage=stage).setup(model)
    for step in range(2):
        rng = np.random.RandomState(20 + step)
        x, t = rng.randn(4, 2, 5, 7), rng.randn(4, 2, 5, 7)
        d = mesh.rank("data")
        opt.update(lambda x, t: mnpar.spatial.mean_squared_error(model(x), t, grid),
                   grid.tile(x[2 * d: 2 * d + 2]), grid.tile(t[2 * d: 2 * d + 2]))
    return model, opt, grid


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_spatial_grid_sharded_over_the_data_axis(spatial_mesh, stage):
    if spatial_mesh is None:
        return
    ref, _, g0 = spatial_run(spatial_mesh, 0)
    _, opt, g1 = spatial_run(spatial_mesh, stage)
    assert_matches(opt, ref, False, **TOL)
    for g in (g0, g1):
        g.free()
