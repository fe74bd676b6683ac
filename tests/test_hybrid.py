"""Hybrid parallelism: model-parallel pairs, each pair a data-parallel replica.

::

    world rank   0     1     2     3
    pair (mp)    0     0     1     1      l1 on the even rank, l2 on the odd one
    stage (dp)   0     1     0     1      gradients averaged over the same stage

A ``mnpar.Mesh`` (``data`` x ``pipeline``) names both groups. With
``size // 2`` pairs (a rank left over sits out), one update equals a
single-process update of the whole model on the pairs' concatenated batches.
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import mnpar

ROWS = 4


def layers():
    rng = np.random.RandomState(0)
    l1, l2 = L.Linear(6, 5), L.Linear(5, 3)
    for p in list(l1.params()) + list(l2.params()):
        p.array[...] = rng.standard_normal(p.shape)
    return l1, l2


def batch(lo, hi):
    rng = np.random.RandomState(7)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    t = rng.randint(0, 3, 64).astype(np.int32)
    return x[lo:hi], t[lo:hi]


def split(world):
    """The pairs' mesh over the ranks that make whole pairs (None on a rank left over)."""
    pairs = world.size // 2
    active = world.rank < 2 * pairs
    used = world.split(int(not active), world.rank)
    mesh = mnpar.Mesh(used, data=-1, pipeline=2) if active else None
    return pairs, used, mesh


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("double_buffering", [False, True])
def test_one_hybrid_update_equals_single_process_training(double_buffering):
    world = mnpar.create_communicator("naive", timeout=30)
    pairs, used, mesh = split(world)
    if mesh is not None:
        mp, dp = mesh.comm("pipeline"), mesh.comm("data")
        stage = layers()[mp.rank]
        opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.5), dp,
                                                double_buffering=double_buffering)
        opt.setup(stage)
        x, t = batch(dp.rank * ROWS, (dp.rank + 1) * ROWS)

        def loss():
            if mp.rank == 0:
                phi = mnpar.functions.send(F.relu(stage(x)), mp, rank=1)
                y = mnpar.functions.recv(mp, rank=1, delegate_variable=phi)
                return F.softmax_cross_entropy(y, t)
            h = mnpar.functions.recv(mp, rank=0)
            return mnpar.functions.send(stage(h), mp, rank=0)

        opt.update(loss)
        if double_buffering:
            opt.flush()
        ref = layers()
        ref_opt = chainer.optimizers.SGD(lr=0.5).setup(chainer.ChainList(*ref))
        xs, ts = batch(0, pairs * ROWS)
        ref_opt.update(lambda: F.softmax_cross_entropy(ref[1](F.relu(ref[0](xs))), ts))
        for name, p in stage.namedparams():
            np.testing.assert_allclose(p.array, dict(ref[mp.rank].namedparams())[name].array,
                                       rtol=1e-5, atol=1e-6, err_msg=name)
        mesh.free()
    for c in (used, world):
        c.finalize()
