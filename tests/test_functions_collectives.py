"""Differentiable collectives: values, and gradients equal to the adjoint.

Every rank ``r`` has inputs made from seed ``r`` and a loss ``sum(w_r * y_r)``
with weights from seed ``100 + r``; the expected values and gradients are
computed in NumPy from every rank's seeds, as one process would.
"""
import chainer
import chainer.functions as F
import numpy as np
import pytest

from mnpar import functions as mf

pytestmark = pytest.mark.mpi(min_size=1)
DTYPES = [np.float16, np.float32, np.float64]
TOL = {np.float16: dict(rtol=2e-3, atol=2e-3), np.float32: dict(rtol=1e-6, atol=1e-6),
       np.float64: dict(rtol=1e-12, atol=1e-12)}
SHAPE = (2, 3)


def x_of(rank, dtype, j=0):
    return np.random.RandomState(10 * rank + j).uniform(-1, 1, SHAPE).astype(dtype)


def w_of(rank, dtype, j=0):
    return np.random.RandomState(1000 + 10 * rank + j).uniform(-1, 1, SHAPE).astype(dtype)


def loss(ys, rank):
    ys = ys if isinstance(ys, tuple) else (ys,)
    return sum(F.sum(y * w_of(rank, y.dtype, j)) for j, y in enumerate(ys))


def close(actual, expected, dtype):
    np.testing.assert_allclose(np.asarray(actual, np.float64),
                               np.asarray(expected, np.float64), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_bcast_sums_gradients_on_the_root(mcomm, dtype):
    root = mcomm.size - 1
    x = chainer.Variable(x_of(root, dtype)) if mcomm.rank == root else None
    y = mf.bcast(mcomm, x, root=root)
    close(y.array, x_of(root, dtype), dtype)
    assert y.dtype == dtype
    loss(y, mcomm.rank).backward()
    if mcomm.rank == root:
        close(x.grad, sum(w_of(r, dtype) for r in range(mcomm.size)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_scatters_gradients_back(mcomm, dtype):
    # Off the root, x comes from a larger graph (2 * v): its gradient goes through.
    v = chainer.Variable(x_of(mcomm.rank, dtype))
    out = mf.gather(mcomm, v * 2, root=0)
    if mcomm.rank == 0:
        assert isinstance(out, tuple) and len(out) == mcomm.size
        for r, y in enumerate(out):
            close(y.array, 2 * x_of(r, dtype), dtype)
        loss(out, 0).backward()
    else:
        assert out.shape == (0,)
        out.backward()
    close(v.grad, 2 * w_of(0, dtype, mcomm.rank), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_gathers_gradients_to_the_root(mcomm, dtype):
    xs = None
    if mcomm.rank == 0:
        xs = [chainer.Variable(x_of(0, dtype, j)) for j in range(mcomm.size)]
    y = mf.scatter(mcomm, xs, root=0)
    close(y.array, x_of(0, dtype, mcomm.rank), dtype)
    loss(y, mcomm.rank).backward()
    if mcomm.rank == 0:
        for j, x in enumerate(xs):
            close(x.grad, w_of(j, dtype), dtype)


def test_scatter_splits_one_array_along_its_first_axis(mcomm):
    whole = None
    if mcomm.rank == 0:
        whole = chainer.Variable(np.arange(mcomm.size * 2, dtype=np.float64).reshape(-1, 2))
    y = mf.scatter(mcomm, whole)
    np.testing.assert_array_equal(y.array, [2 * mcomm.rank, 2 * mcomm.rank + 1])
    F.sum(y * (mcomm.rank + 1)).backward()
    if mcomm.rank == 0:
        np.testing.assert_array_equal(whole.grad[:, 0], np.arange(1, mcomm.size + 1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_sends_each_gradient_home_and_sums(mcomm, dtype):
    x = chainer.Variable(x_of(mcomm.rank, dtype))
    ys = mf.allgather(mcomm, x)
    assert len(ys) == mcomm.size
    for r, y in enumerate(ys):
        close(y.array, x_of(r, dtype), dtype)
    loss(ys, mcomm.rank).backward()
    close(x.grad, sum(w_of(r, dtype, mcomm.rank) for r in range(mcomm.size)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_alltoall_returns_each_gradient_to_its_sender(mcomm, dtype):
    me, n = mcomm.rank, mcomm.size
    xs = [chainer.Variable(x_of(me, dtype, j)) for j in range(n)]
    ys = mf.alltoall(mcomm, xs)
    for i, y in enumerate(ys):
        close(y.array, x_of(i, dtype, me), dtype)
    loss(ys, me).backward()
    for j, x in enumerate(xs):
        close(x.grad, w_of(j, dtype, me), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_gradient_is_the_allreduce_of_gradients(mcomm, dtype):
    x = chainer.Variable(x_of(mcomm.rank, dtype))
    y = mf.allreduce(mcomm, x)
    close(y.array, sum(x_of(r, np.float64) for r in range(mcomm.size)), dtype)
    loss(y, mcomm.rank).backward()
    close(x.grad, sum(w_of(r, dtype) for r in range(mcomm.size)), dtype)


def test_inputs_without_gradients_still_join_backward(mcomm):
    # The root broadcasts a plain array; every other rank still backprops, and
    # the root must take part in that backward's gather or they would hang.
    data = x_of(0, np.float64) if mcomm.rank == 0 else None
    y = mf.bcast(mcomm, data)
    loss(y, mcomm.rank).backward()
    z = mf.allreduce(mcomm, chainer.Variable(np.full(3, float(mcomm.rank + 1))))
    np.testing.assert_allclose(z.array, np.full(3, mcomm.size * (mcomm.size + 1) / 2))


def test_non_root_backprop_through_a_larger_graph(mcomm):
    # gather -> root computes -> bcast back -> every rank's loss. Off the root the
    # bcast node has only a phony input, yet its backward (a gather) must run
    # before the gather's backward (a scatter), as on the root.
    n = mcomm.size
    ws = [np.random.RandomState(50 + r).uniform(-1, 1, (3, 3)) for r in range(n)]
    inputs = [np.random.RandomState(60 + r).uniform(-1, 1, (2, 3)) for r in range(n)]
    ref_w = [chainer.Variable(w.copy()) for w in ws]
    hs = [F.tanh(F.matmul(x, w)) for x, w in zip(inputs, ref_w)]
    s = sum(h * (i + 1) for i, h in enumerate(hs))
    sum(F.sum(F.sin(s) * w_of(r, np.float64)) for r in range(n)).backward()

    w = chainer.Variable(ws[mcomm.rank].copy())
    h = F.tanh(F.matmul(inputs[mcomm.rank], w))
    gathered = mf.gather(mcomm, h, root=0)
    if mcomm.rank == 0:
        total = sum(g * (i + 1) for i, g in enumerate(gathered))
        y = mf.bcast(mcomm, total, root=0)
        my_loss = F.sum(F.sin(y) * w_of(0, np.float64))
    else:
        y = mf.bcast(mcomm, None, root=0)
        my_loss, = mf.pseudo_connect(gathered, F.sum(F.sin(y) * w_of(mcomm.rank, np.float64)))
    close(y.array, s.array, np.float64)
    my_loss.backward()
    close(w.grad, ref_w[mcomm.rank].grad, np.float64)


def test_no_backprop_mode_builds_no_graph(mcomm):
    with chainer.no_backprop_mode():
        for _ in range(2):
            y = mf.allreduce(mcomm, np.ones(2))
            ys = mf.allgather(mcomm, np.ones(2))
            b = mf.bcast(mcomm, np.ones(2) if mcomm.rank == 0 else None)
    assert y.creator is None and ys[0].creator is None and b.creator is None
    np.testing.assert_array_equal(y.array, np.full(2, mcomm.size))


def test_bad_arguments_raise_naming_the_value(mcomm):
    with pytest.raises(ValueError, match=rf"root={mcomm.size} is out of range"):
        mf.bcast(mcomm, np.ones(2), root=mcomm.size)
    with pytest.raises(TypeError, match="root must be an int rank, not str"):
        mf.gather(mcomm, np.ones(2), root="0")
    with pytest.raises(ValueError, match=rf"got {mcomm.size + 1} for a communicator of size"):
        mf.alltoall(mcomm, [np.ones(1)] * (mcomm.size + 1))
    with pytest.raises(TypeError, match="x must be a Variable or an array, not list"):
        mf.allreduce(mcomm, [1.0, 2.0])
