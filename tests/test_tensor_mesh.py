"""Tensor parallelism composed on a mesh: data x tensor and pipeline x tensor on 4 ranks,
each equal to one process."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from tensor_models import LM, Block
from tensor_twins import build, compare_params
from test_tensor_parallelize import LM_SIZES, lm_plan, tokens

import mnpar
from mnpar.pipeline import PipelineUpdater, build_stage
from mnpar.tensor import Column, Row

pytestmark = pytest.mark.mpi(min_size=4)


@pytest.fixture
def world():
    c = mnpar.create_communicator("naive", timeout=30)
    used = c.split(int(c.rank >= 4), c.rank)  # 4 ranks; the others sit out
    yield used if c.rank < 4 else None
    used.finalize()
    c.finalize()


def lm():
    return L.Classifier(LM(**dict(LM_SIZES, dropout=0.2)))


def test_data_by_tensor_parallelism_equals_one_process(world):
    if world is None:
        return
    mesh = mnpar.Mesh(world, data=2, tensor=2)
    x, t = tokens(batch=4)
    ref = build(lm)
    ref_opt = chainer.optimizers.Adam().setup(ref)
    model = mnpar.tensor.parallelize(build(lm), mesh, lm_plan())
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), mesh.comm("data"))
    opt.setup(model)
    rows = slice(2 * mesh.rank("data"), 2 * mesh.rank("data") + 2)  # this replica's batch
    mine_x, mine_t = x[rows], t.reshape(4, -1)[rows].reshape(-1)
    for _ in range(3):
        with mnpar.random.scope(ref, ref_opt, seed=1):
            ref_opt.update(ref, x, t)
        with mnpar.random.scope(model, opt, seed=1, data=mesh.comm("data")):
            opt.update(model, mine_x, mine_t)
        compare_params(model, ref, grads=False)
    mesh.free()


class Head(chainer.Chain):
    """The mean over positions, then class scores."""

    def __init__(self, d, classes):
        super().__init__()
        with self.init_scope():
            self.fc = L.Linear(d, classes)

    def forward(self, h):
        return self.fc(F.mean(h, axis=1))


D, HEADS = 10, 5


def blocks():
    return chainer.Sequential(Block(D, HEADS, 9, 0.0), Block(D, HEADS, 9, 0.0), Head(D, 3))


BLOCK_PLAN = {"*/query": Column(unit=2), "*/key": Column(unit=2), "*/value": Column(unit=2),
              "*/attention/out": Row(unit=2), "*/fc1": "column", "*/fc2": "row"}


@pytest.mark.parametrize("schedule", ["1f1b", "zb1"])
def test_pipeline_by_tensor_parallelism_equals_one_process(world, schedule):
    if world is None:
        return
    mesh = mnpar.Mesh(world, pipeline=2, tensor=2)
    rng = np.random.RandomState(2)
    x, t = rng.standard_normal((4, 5, D)), rng.randint(0, 3, 4).astype(np.int32)
    ref = build(blocks)
    ref_opt = chainer.optimizers.Adam().setup(L.Classifier(ref))
    seq = mnpar.tensor.parallelize(build(blocks), mesh, BLOCK_PLAN)
    pipe = mesh.comm("pipeline")
    stage = build_stage(seq, [2, 1], pipe, loop=True)
    data = chainer.datasets.TupleDataset(x, t)
    if pipe.rank == 0:
        target = L.Classifier(stage)
    else:
        target, data = stage, mnpar.datasets.create_empty_dataset(data)
    opt = chainer.optimizers.Adam().setup(target)
    updater = PipelineUpdater(chainer.iterators.SerialIterator(data, 4, shuffle=False), opt,
                              pipe, n_microbatches=2, schedule=schedule)
    try:
        for _ in range(2):
            ref_opt.update(ref_opt.target, x, t)
            updater.update()
    finally:
        updater.finalize()
    mine = [0, 1] if pipe.rank == 0 else [2]
    for i in mine:
        compare_params(seq[i], ref[i], grads=False)
    mesh.free()

