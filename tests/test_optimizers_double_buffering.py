"""double_buffering=True: each update applies the previous step's mean gradients."""
import chainer
import numpy as np
import pytest
from test_optimizers_multi_node import NAMES, Net, assert_same, local, whole

import mnpar


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
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.5), comm,
                                            double_buffering=True).setup(model)
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
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.5), comm,
                                            double_buffering=True).setup(model)
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
