"""scatter_batch / gather_batch: transparent, features kept scattered by key."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import mnpar
from mnpar.functions import gather_batch, scatter_batch


class NetA(chainer.Chain):
    """The tutorial's complex network: a dict of outputs, two of them features."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(5, 2, initialW=np.arange(10.0).reshape(2, 5) / 10)

    def forward(self, x):
        h = self.l(x)
        return {"outputs": {"out1": h, "out2": 2 * h}, "second_output": F.tanh(h)}


class NetB(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(2, 1, initialW=np.array([[0.5, -1.0]]))

    def forward(self, x):
        return self.l(x)


def batch(n):
    rng = np.random.RandomState(0)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    return x, rng.standard_normal((n, 1)).astype(np.float32)


def loss_of(b_out, second, t):
    return F.sum((b_out - t) ** 2) + F.sum(second)


def single_process(n):
    x, t = batch(n)
    net_a, net_b = NetA(), NetB()
    xv = chainer.Variable(x)
    a = net_a(xv)
    b = net_b(a["outputs"]["out1"] + a["outputs"]["out2"])
    loss = loss_of(b, a["second_output"], t)
    loss.backward()
    return loss.array, xv.grad, net_a, net_b


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("rows_per_rank", [2, 0.5])  # 0.5: fewer rows than ranks
def test_features_stay_scattered_and_gradients_match_one_process(comm, rows_per_rank):
    n = int(rows_per_rank * comm.size) + 1
    x, t = batch(n)
    xv = chainer.Variable(x)
    net_a, net_b = NetA(), NetB()
    mine = scatter_batch(comm, {"x": xv, "t": t} if comm.rank == 0 else None)
    assert mine["x"].shape[0] == len(np.array_split(np.arange(n), comm.size)[comm.rank])
    a = gather_batch(comm, net_a(mine["x"]), except_keys=["out1", "out2"])
    out1, out2 = a["outputs"]["out1"], a["outputs"]["out2"]
    assert out1.shape == (mine["x"].shape[0], 2)  # kept on this rank
    b = gather_batch(comm, (net_b(out1 + out2), mine["t"]))
    if comm.rank == 0:
        loss = loss_of(b[0], a["second_output"], b[1])
        loss.backward()
    else:
        b[0].backward()
    ref_loss, ref_gx, ref_a, ref_b = single_process(n)
    if comm.rank == 0:
        np.testing.assert_allclose(loss.array, ref_loss, rtol=1e-5)
        np.testing.assert_allclose(xv.grad, ref_gx, rtol=1e-5, atol=1e-6)
    for net, ref in ((net_a, ref_a), (net_b, ref_b)):
        for (name, p), (_, r) in zip(sorted(net.namedparams()), sorted(ref.namedparams())):
            np.testing.assert_allclose(comm.allreduce(p.grad), r.grad, rtol=1e-5, atol=1e-6,
                                       err_msg=name)


@pytest.mark.mpi(min_size=1)
def test_backward_from_one_output_runs_every_collective_of_the_call(comm):
    # Regression guard: an unused leaf must not leave a peer waiting in its backward.
    x = chainer.Variable(np.arange(12.0).reshape(6, 2))
    y = chainer.Variable(np.ones((6, 3)))
    mine = scatter_batch(comm, (x, y) if comm.rank == 0 else None)
    out = gather_batch(comm, {"a": mine[0] * 3, "b": mine[1]})
    if comm.rank == 0:
        F.sum(out["a"]).backward()
        np.testing.assert_array_equal(x.grad, np.full((6, 2), 3.0))
        np.testing.assert_array_equal(y.grad, np.zeros((6, 3)))
    else:
        out["b"].backward()


@pytest.mark.mpi(min_size=1)
def test_errors_are_raised_on_every_rank(comm):
    with pytest.raises(ValueError, match=r"leaf \['s'\] is a scalar"):
        scatter_batch(comm, {"s": np.float32(1.0)} if comm.rank == 0 else None)
    with pytest.raises(TypeError, match=r"\['k'\] must be a Variable, an array"):
        scatter_batch(comm, {"k": "text"} if comm.rank == 0 else None)
    if comm.size > 1:
        mine = (np.zeros((1, 2)),) if comm.rank == 0 else [np.zeros((1, 2))]
        with pytest.raises(ValueError, match="needs the same structure on every rank"):
            gather_batch(comm, mine)


def test_exported_from_mnpar_functions():
    assert mnpar.functions.scatter_batch is scatter_batch
