"""Sharding over the data axis of a mesh with tensor parallelism; checkpoints of parts.

On 4 ranks, ``Mesh(world, data=2, tensor=2)`` and an MLP split by
``mnpar.tensor.mlp_plan``: every stage over ``mesh.comm("data")`` equals plain
data parallelism over it (float64, 1e-12). A checkpoint of the tensor-parallel
parts (blocks of each weight, ``box`` in the index) sharded over the data axis
loads into one process, where it equals the same training run in one process,
and a one-process checkpoint loads into the parts.
"""
import os
import shutil
import tempfile

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from helpers import float64

import mnpar
from mnpar.checkpoint import holdings

pytestmark = pytest.mark.mpi(min_size=4)
TOL = dict(rtol=1e-12, atol=1e-13)


@pytest.fixture(scope="module")
def world():
    c = mnpar.create_communicator("naive", timeout=30)
    sub = c.split(int(c.rank >= 4), c.rank)
    yield sub if c.rank < 4 else None
    sub.finalize()
    c.finalize()


@pytest.fixture(scope="module")
def mesh(world):
    if world is None:
        yield None
        return
    m = mnpar.Mesh(world, data=2, tensor=2)
    yield m
    m.free()


class Mlp(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(5, 12)
            self.l2 = L.Linear(12, 6)
            self.l3 = L.Linear(6, 3)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


def whole():
    np.random.seed(4)
    return L.Classifier(float64(Mlp()))


def rows(step, lo, hi):
    rng = np.random.RandomState(30 + step)
    return rng.randn(8, 5)[lo:hi], rng.randint(0, 3, 8).astype(np.int32)[lo:hi]


def split_run(mesh, stage, steps=2):
    model = whole()
    mnpar.tensor.parallelize(model, mesh, mnpar.tensor.mlp_plan(model))
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01),
                                            mesh.comm("data"), stage=stage).setup(model)
    d = mesh.rank("data")
    for step in range(steps):
        opt.update(model, *rows(step, 4 * d, 4 * d + 4))
    return model, opt


def parts(opt):
    return {p.name: (p.box, p.flat, p.array.reshape(-1).copy())
            for p in holdings(opt, split=False).parts}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_tensor_parts_sharded_over_the_data_axis(mesh, stage):
    if mesh is None:
        return
    _, ref = split_run(mesh, 0)
    _, opt = split_run(mesh, stage)
    want, got = parts(ref), parts(opt)
    for name, (box, flat, array) in got.items():
        ref_box, _, ref_array = want[name]
        assert box == ref_box, name
        np.testing.assert_allclose(array, ref_array[flat[0]:flat[1]], err_msg=name, **TOL)


@pytest.mark.parametrize("stage", [0, 2])
def test_a_checkpoint_of_parts_loads_in_one_process(world, mesh, stage):
    if mesh is None:
        return
    root = world.bcast_obj(tempfile.mkdtemp() if world.rank == 0 else None)
    try:
        _, opt = split_run(mesh, stage)
        path = os.path.join(root, "parts")
        mnpar.checkpoint.save(path, world, opt)
        index = mnpar.checkpoint.read_index(path)
        assert index.arrays["model:main/predictor/l1/W"].pieces[0].box is not None
        own = world.split(world.rank, 0)
        alone = whole()
        mnpar.checkpoint.load(path, own, chainer.optimizers.Adam(alpha=0.01).setup(alone))
        ref = whole()
        ref_opt = chainer.optimizers.Adam(alpha=0.01).setup(ref)
        for step in range(2):
            ref_opt.update(ref, *rows(step, 0, 8))
        for (name, a), (_, b) in zip(sorted(alone.namedparams()), sorted(ref.namedparams())):
            np.testing.assert_allclose(a.array, b.array, err_msg=name, **TOL)
        back = os.path.join(root, "whole")
        if world.rank == 0:
            mnpar.checkpoint.save(back, own, ref_opt)
        own.finalize()
        world.allgather_obj(None)
        _, split = split_run(mesh, 3, steps=0)
        mnpar.checkpoint.load(back, world, split)
        params = dict(ref.namedparams())
        for name, (box, flat, array) in parts(split).items():
            kind, path = name.split("/", 1)
            if kind != "model:main":
                continue
            full = params["/" + path].array
            block = full if box is None else full[tuple(slice(a, b) for a, b in box)]
            assert np.array_equal(array, block.reshape(-1)[flat[0]:flat[1]]), name
    finally:
        world.allgather_obj(None)
        if world.rank == 0:
            shutil.rmtree(root, ignore_errors=True)
