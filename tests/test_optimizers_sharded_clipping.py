"""GradientClipping on sharded gradients: the whole model's norm, each element once.

The peers' failure this pins down: clipping by the norm of this rank's shard
(pytorch/pytorch#170862), or counting a replicated parameter once per rank.
"""
import chainer
import numpy as np
import pytest
from sharded_models import OPTIMIZERS, Net, assert_matches, local, train

import mnpar
from mnpar.optimizer_hooks import GradientClipping

pytestmark = pytest.mark.mpi(min_size=1)
TOL = dict(rtol=1e-12, atol=1e-14)


@pytest.fixture(scope="module")
def comm():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


class Norms(GradientClipping):
    """mnpar's hook, keeping every norm it clipped by."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.norms = []

    def __call__(self, opt):
        super().__call__(opt)
        self.norms.append(self.norm)


def whole_norms(comm, steps=3):
    """The norms one process clips by, on the whole batch, with chainer's own hook."""
    from sharded_models import ROWS, batch

    model = Net()
    opt = chainer.optimizers.Adam(alpha=0.01).setup(model)
    norms = []

    def record(o):
        grads = [p.grad.ravel() for p in o.target.params()]
        norms.append(float(np.sqrt(sum(g.dot(g) for g in grads))))
    opt.add_hook(record, name="record")
    opt.add_hook(chainer.optimizer_hooks.GradientClipping(0.05))
    for step in range(steps):
        opt.update(model, *batch(step, 0, comm.size * ROWS))
    return norms


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_norm_is_the_whole_models(comm, stage):
    hook = []
    _, opt = train(comm, stage, OPTIMIZERS["Adam"],
                   [lambda c, m: hook.append(Norms(c, 0.05)) or hook[0]])
    np.testing.assert_allclose(hook[0].norms, whole_norms(comm), rtol=1e-10)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_hook_over_this_rank_alone_sums_the_shards_over_the_data_axis(comm, stage):
    # The hook's communicator meets the data axis in this rank only (a model not split):
    # the shards' squares are summed over the data axis first.
    own = comm.split(comm.rank, 0)
    try:
        hook = []
        _, opt = train(comm, stage, OPTIMIZERS["Adam"],
                       [lambda c, m: hook.append(Norms(own, 0.05)) or hook[0]])
        np.testing.assert_allclose(hook[0].norms, whole_norms(comm), rtol=1e-10)
    finally:
        own.finalize()


@pytest.mark.parametrize("stage", [1, 3])
def test_clipped_updates_equal_plain_data_parallelism(comm, stage):
    make = [lambda c, m: GradientClipping(c, 0.05, replicated=[(c, m)])]
    ref, _ = train(comm, 0, OPTIMIZERS["MomentumSGD"], make)
    _, opt = train(comm, stage, OPTIMIZERS["MomentumSGD"], make)
    assert_matches(opt, ref, False, **TOL)


@pytest.mark.mpi(min_size=4)
def test_data_axis_partly_in_the_hooks_communicator_is_refused_on_every_rank(comm):
    pairs = comm.split(comm.rank // 2, comm.rank)  # {0, 1}, {2, 3}: the data axis is all
    try:
        model = Net()
        opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(), comm, stage=2)
        opt.setup(model).add_hook(GradientClipping(pairs, 1.0))
        with pytest.raises(ValueError, match="sharded over a communicator of 4 ranks that only "
                                             "partly overlaps the hook's"):
            opt.update(model, *local(comm, 0))
    finally:
        pairs.finalize()


@pytest.mark.parametrize("hook, match", [
    (lambda: chainer.optimizer_hooks.GradientClipping(1.0),
     "GradientClipping cannot run on shards: it clips by the norm of this rank's shard"),
    (lambda: chainer.optimizer_hooks.GradientLARS(),
     "GradientLARS cannot run on shards: it scales each parameter by that parameter's norms"),
    (lambda: chainer.optimizer_hooks.GradientNoise(0.1),
     "GradientNoise cannot run on shards: it draws its noise per shard"),
    (lambda: (lambda opt: None), "'<lambda>' .* is not known to work element by element"),
])
def test_hooks_that_are_not_exact_on_shards_are_refused(comm, hook, match):
    model = Net()
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(), comm, stage=1)
    opt.setup(model).add_hook(hook())
    with pytest.raises(ValueError, match=match):
        opt.update(model, *local(comm, 0))
