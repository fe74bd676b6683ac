"""Sharded data parallelism (stages 1 to 3) against plain data parallelism.

After K updates every stage's parameters equal stage 0's: bit for bit at one
and two ranks (a sum of two has one order; scaling by 1/2 is exact), to 1e-12
in float64 at three and four, where MPI's reduce-scatter may add in another
order than its allreduce. For Adam, MomentumSGD, AdaGrad and RMSprop, with
WeightDecay and Lasso, on sizes no rank count divides.
"""
import chainer
import chainer.optimizer_hooks as hooks
import numpy as np
import pytest
from sharded_models import OPTIMIZERS, ROWS, Net, assert_matches, batch, local, shards, train

import mnpar
from mnpar.optimizer_hooks import GradientClipping

pytestmark = pytest.mark.mpi(min_size=1)
TOL = dict(rtol=1e-12, atol=1e-14)
HOOKS = {  # each made from the data-parallel communicator and the model
    "none": (),
    "WeightDecay": (lambda c, m: hooks.WeightDecay(1e-2),),
    "Lasso": (lambda c, m: hooks.Lasso(1e-2),),
    # Plain data parallelism declares its copies replicated; on shards that is dropped.
    "GradientClipping": (lambda c, m: GradientClipping(c, 0.05, replicated=[(c, m)]),),
    "all": (lambda c, m: hooks.WeightDecay(1e-2), lambda c, m: hooks.Lasso(1e-3),
            lambda c, m: GradientClipping(c, 0.05, replicated=[(c, m)])),
}


@pytest.fixture(scope="module")
def comm():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


def exact(comm):
    return comm.size <= 2


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("hook", sorted(HOOKS))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_stage_equals_plain_data_parallelism(comm, stage, hook, name):
    ref, _ = train(comm, 0, OPTIMIZERS[name], HOOKS[hook])
    _, opt = train(comm, stage, OPTIMIZERS[name], HOOKS[hook])
    assert opt.t == 3
    # The clipping norm sums the squares in another order (over shards, not copies).
    same_order = exact(comm) and hook not in ("GradientClipping", "all")
    assert_matches(opt, ref, same_order, **TOL)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_stage_equals_one_process_on_the_whole_batch(comm, stage):
    ref = Net()
    ref_opt = chainer.optimizers.Adam(alpha=0.01).setup(ref)
    _, opt = train(comm, stage, OPTIMIZERS["Adam"])
    for step in range(3):
        ref_opt.update(ref, *batch(step, 0, comm.size * ROWS))
    assert_matches(opt, ref, False, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_gradient_accumulation_equals_plain(comm, stage):
    # Two backwards per update, the gradients added before the update.
    models, opts = [], []
    for s in (0, stage):
        model = Net()
        opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01), comm,
                                                stage=s).setup(model)
        for step in range(2):
            model.cleargrads()
            for micro in range(2):
                model(*local(comm, 2 * step + micro)).backward()
            opt.update()
        models.append(model)
        opts.append(opt)
    # Stage 3 reduces each backward apart (two sums, not one): equal to rounding.
    assert_matches(opts[1], models[0], exact(comm) and stage < 3, **TOL)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_update_rules_of_the_model_are_the_shards(comm, stage):
    # A hyperparameter set on the model's parameter reaches the rule that runs.
    model = Net()
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm,
                                            stage=stage).setup(model)
    opt.update(model, *local(comm, 0))
    model.l1.W.update_rule.enabled = False
    before = {n: s.copy() for n, (_, _, s) in shards(opt).items()}
    opt.update(model, *local(comm, 1))
    after = {n: s for n, (_, _, s) in shards(opt).items()}
    assert np.array_equal(after["/l1/W"], before["/l1/W"])
    changed = [n for n in after if after[n].size and not np.array_equal(after[n], before[n])]
    assert "/l2/W" in changed or after["/l2/W"].size == 0


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_float32_model(comm, stage):
    ref, _ = train(comm, 0, OPTIMIZERS["Adam"], model=Net(dtype=np.float32))
    _, opt = train(comm, stage, OPTIMIZERS["Adam"], model=Net(dtype=np.float32))
    assert_matches(opt, ref, exact(comm), rtol=1e-5, atol=1e-6)


def test_stage3_keeps_no_whole_parameter_between_updates(comm):
    model, opt = train(comm, 3, OPTIMIZERS["Adam"])
    assert all(p.array is None for p in model.params())
    assert opt._gather.gathered_bytes == 0


@pytest.mark.parametrize("reshard", [True, False])
def test_stage3_reshard_after_forward_either_way(comm, reshard):
    ref, _ = train(comm, 0, OPTIMIZERS["Adam"])
    _, opt = train(comm, 3, OPTIMIZERS["Adam"], reshard_after_forward=reshard)
    assert_matches(opt, ref, exact(comm), **TOL)


def test_stage3_gathered_block_evaluates_without_a_gather_per_call(comm):
    model, opt = train(comm, 3, OPTIMIZERS["Adam"])
    ref, _ = train(comm, 0, OPTIMIZERS["Adam"])
    x, t = local(comm, 9)
    with opt.gathered(), chainer.no_backprop_mode():
        got = [model(x, t).array for _ in range(comm.rank + 1)]  # uneven: no collective
    want = ref(x, t).array
    for g in got:
        np.testing.assert_allclose(g, want, **TOL)
    assert opt._gather.gathered_bytes == 0


@pytest.mark.parametrize("stage", [1, 2])
def test_first_update_only_broadcasts_when_ranks_started_apart(comm, stage):
    ref, ref_opt = train(comm, 0, OPTIMIZERS["Adam"], model=Net(seed=comm.rank))
    _, opt = train(comm, stage, OPTIMIZERS["Adam"], model=Net(seed=comm.rank))
    assert opt.t == ref_opt.t
    assert_matches(opt, ref, exact(comm), **TOL)


def test_stage3_broadcasts_rank_0s_parameters_at_setup(comm):
    # Its first update is then valid on every rank: plain training from rank 0's weights.
    ref, _ = train(comm, 0, OPTIMIZERS["Adam"], model=Net(seed=0))
    _, opt = train(comm, 3, OPTIMIZERS["Adam"], model=Net(seed=comm.rank))
    assert opt.t == 3
    assert_matches(opt, ref, exact(comm), **TOL)


def test_stage3_optimizers_dropped_without_free_are_collected(comm):
    # Regression: chainer's global function hook held every stage 3 optimizer forever.
    import gc
    import weakref

    gone = []
    for _ in range(2):
        model, opt = train(comm, 3, OPTIMIZERS["Adam"], steps=1)
        gone.append(weakref.ref(opt))
        del model, opt
    gc.collect()
    assert all(ref() is None for ref in gone)
    left = [h for h in chainer.get_function_hooks().values() if "stage3" in str(h.name)]
    assert all(h.gatherer() is None for h in left)  # inert; the next stage 3 one removes them
