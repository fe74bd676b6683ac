"""double_buffering=True: each update applies the previous step's mean gradients."""
import chainer
import numpy as np
import pytest
from test_optimizers_multi_node import NAMES, ROWS, Net, assert_same, local, whole

import mnpar


def double_buffered(comm, model, **kwargs):
    """A double-buffering SGD (lr 0.5) on ``comm``, set up on ``model``."""
    return mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.5), comm,
                                             double_buffering=True, **kwargs).setup(model)


def stale_reference(comm, steps, lr):
    """One process, full batches, every gradient applied one update late."""
    ref = Net(0)
    opt = chainer.optimizers.SGD(lr=lr).setup(ref)
    pending, states = None, []
    for step in range(steps):
        ref.cleargrads()
        ref(*whole(comm, step)).backward()
        grads = [(p, np.zeros_like(p.array) if p.grad is None else p.grad.copy())
                 for p in ref.params()]
        if pending is not None:
            for p, g in pending:
                p.grad = g
            opt.update()
        pending = grads
        states.append({n: p.array.copy() for n, p in ref.namedparams()})
    for p, g in pending:
        p.grad = g
    opt.update()
    return ref, states


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", NAMES)
def test_updates_apply_gradients_one_step_stale(name):
    comm = mnpar.create_communicator(name, timeout=30)
    model = Net(0)
    opt = double_buffered(comm, model)
    ref, states = stale_reference(comm, 4, 0.5)
    for step in range(4):
        opt.update(model, *local(comm, step))
        for n, p in model.namedparams():
            np.testing.assert_allclose(p.array, states[step][n], rtol=1e-5, atol=1e-6)
    assert opt.t == 3  # the first update only posted its gradients
    opt.flush()
    assert_same(model, ref)
    comm.finalize()


@pytest.mark.mpi(min_size=2)
def test_gradients_of_parameters_replaced_by_the_broadcast_are_dropped(comm):
    model = Net(comm.rank)
    opt = double_buffered(comm, model)
    opt.update(model, *local(comm, 0))
    opt.flush()  # nothing was posted: the gradients belonged to other weights
    assert_same(model, Net(0))
    assert opt.t == 0


def test_double_buffering_needs_an_mnpar_communicator():
    class Fake:
        def multi_node_mean_grad(self, model, zero_fill=False):
            pass

    with pytest.raises(TypeError, match="double_buffering needs an mnpar communicator"):
        mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(), Fake(),
                                          double_buffering=True)


def _simulate_nodes(monkeypatch, ranks_per_node):
    if ranks_per_node:
        monkeypatch.setenv("MNPAR_RANKS_PER_NODE", ranks_per_node)
    else:
        monkeypatch.delenv("MNPAR_RANKS_PER_NODE", raising=False)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name,ranks_per_node", [(n, "") for n in NAMES]
                         + [("hierarchical", "1"), ("hierarchical", "2")])
def test_update_applies_the_blocking_mean_of_the_step_before_bit_for_bit(
        monkeypatch, name, ranks_per_node):
    # Transparency: double buffering only delays the communicator's own mean.
    _simulate_nodes(monkeypatch, ranks_per_node)
    comm = mnpar.create_communicator(name, timeout=30)
    blocking = mnpar.create_communicator(name, timeout=30)
    model, ref = Net(0), Net(0)
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.1), comm,
                                            double_buffering=True).setup(model)
    ref_opt = chainer.optimizers.MomentumSGD(lr=0.1).setup(ref)
    pending = None
    for step in range(5):
        opt.update(model, *local(comm, step))
        ref.cleargrads()
        ref(*local(comm, step)).backward()
        blocking.multi_node_mean_grad(ref, zero_fill=True)
        means = [p.grad.copy() for p in ref.params()]
        if pending is not None:
            for p, g in zip(ref.params(), pending):
                p.grad = g
            ref_opt.update()
        pending = means
        for (n, p), q in zip(model.namedparams(), ref.params()):
            np.testing.assert_array_equal(p.array, q.array, err_msg=f"step {step} {n}")
    opt.flush()
    for p, g in zip(ref.params(), pending):
        p.grad = g
    ref_opt.update()
    for (n, p), q in zip(model.namedparams(), ref.params()):
        np.testing.assert_array_equal(p.array, q.array, err_msg=n)
    blocking.finalize()
    comm.finalize()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("ranks_per_node", ["", "2"])
def test_hierarchical_double_buffering_sums_inside_the_node(monkeypatch, ranks_per_node):
    # Regression: double buffering ran one flat Iallreduce whatever the
    # communicator, so "hierarchical" never used the node's shared memory.
    from mnpar.communicators import _shared_memory

    _simulate_nodes(monkeypatch, ranks_per_node)
    calls = {"reduce_block": 0, "take_leader_row": 0}
    for method in calls:
        original = getattr(_shared_memory.NodeBuffer, method)

        def counted(self, *args, method=method, original=original):
            calls[method] += 1
            return original(self, *args)

        monkeypatch.setattr(_shared_memory.NodeBuffer, method, counted)
    comm = mnpar.create_communicator("hierarchical", timeout=30)
    model = Net(0)
    opt = double_buffered(comm, model)
    for step in range(3):
        opt.update(model, *local(comm, step))
        # Started, not finished: only a leader's allreduce between nodes is in flight.
        leader_across = comm.intra_rank == 0 and comm.inter_size > 1
        assert len(opt._in_flight.requests) == (1 if leader_across else 0)
    opt.flush()
    in_node = comm.intra_size > 1
    assert calls["reduce_block"] == (3 if in_node else 0)
    assert calls["take_leader_row"] == (3 if in_node and comm.inter_size > 1 else 0)
    comm.finalize()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", NAMES)
def test_gradients_that_differ_across_ranks_fail_on_every_rank(name):
    # Regression: double buffering skipped the check that multi_node_mean_grad
    # runs, so mismatched gradients were summed, or left peers waiting.
    comm = mnpar.create_communicator(name, timeout=10)
    model = Net(0)
    opt = double_buffered(comm, model, zero_fill=False)

    def gradients(step):
        model.cleargrads()
        model(*local(comm, step)).backward()

    gradients(0)
    opt.update()  # the same layout everywhere: no error
    gradients(1)
    if comm.rank == 1:
        model.l2.W.grad = None  # rank 1 has no gradient for /l2/W
    with pytest.raises(ValueError, match="multi_node_mean_grad: .*'/l2/W': rank 0 has "
                                         r"\(\(3, 4\), 'float32'\), rank 1 has no gradient"):
        opt.update()
    model.cleargrads()
    if comm.rank != 0:
        gradients(1)  # only rank 0 has nothing to reduce
    with pytest.raises(ValueError, match="multi_node_mean_grad: the models differ"):
        opt.update()
    gradients(1)
    opt.update()  # agreeing again, it applies step 0's mean
    assert opt.t == 1
    comm.finalize()


@pytest.mark.mpi(min_size=2)
def test_a_gradient_that_appears_waits_for_its_mean(comm):
    # Regression: with zero_fill=False, a parameter whose first gradient came
    # in step k was updated at step k with its own rank's raw gradient (its
    # mean was still in flight), so the replicas drifted apart.
    model = Net(0)
    opt = double_buffered(comm, model, zero_fill=False)
    x2 = np.ones((ROWS, 2), np.float32) * (comm.rank + 1)
    before = model.unused.W.array.copy()
    for step in range(3):
        model.cleargrads()
        loss = model(*local(comm, step))
        if step > 0:  # /unused takes part from step 1 on
            loss += chainer.functions.sum(model.unused(x2))
        loss.backward()
        opt.update()
        if step == 1:  # its mean of step 1 is still in flight
            np.testing.assert_array_equal(model.unused.W.array, before)
    weights = comm.allgather(model.unused.W.array)
    assert not np.array_equal(weights[0], before)
    for w in weights[1:]:
        np.testing.assert_array_equal(w, weights[0])
