"""The conjugate collectives: every rank holds the same loss, and the outputs and
gradients are one process's (float64, uneven parts included).

Each test computes a small split computation on every rank of the world and
the same computation whole in one process, and compares the loss, the
gradient of the replicated input and this rank's part of every split weight's
gradient.
"""
import chainer
import chainer.functions as F
import numpy as np
import pytest

import mnpar
from mnpar.functions import _conjugate, _group_ops

pytestmark = pytest.mark.mpi(min_size=1)
M = mnpar.functions


def draw(*shape, seed=0):
    return np.random.RandomState(seed).standard_normal(shape)


def part(a, comm, axis, units=None):
    bounds = _group_ops.balanced(a.shape[axis], comm.size)
    index = [slice(None)] * a.ndim
    index[axis] = slice(bounds[comm.rank], bounds[comm.rank + 1])
    return a[tuple(index)]


def test_balanced_cuts_follow_array_split():
    for total in range(1, 12):
        for parts in range(1, total + 1):
            bounds = _group_ops.balanced(total, parts)
            split = np.array_split(np.arange(total), parts)
            assert [bounds[r + 1] - bounds[r] for r in range(parts)] == [len(s) for s in split]
    assert _group_ops.balanced(12, 4, unit=3) == (0, 3, 6, 9, 12)
    assert _group_ops.balanced(15, 2, unit=3) == (0, 9, 15)


@pytest.mark.parametrize("width", [7, 8])
def test_copy_then_reduce_is_a_linear_split_by_columns_then_rows(mcomm, width):
    """``reduce(relu(copy(x) @ A_cols) @ B_rows)`` == ``relu(x @ A) @ B``."""
    x0, a0, b0 = draw(3, 5), draw(5, width, seed=1), draw(width, 4, seed=2)
    x, a, b = (chainer.Variable(v.copy()) for v in (x0, part(a0, mcomm, 1),
                                                     part(b0, mcomm, 0)))
    y = M.reduce_from_group(mcomm, F.matmul(F.relu(F.matmul(M.copy_to_group(mcomm, x), a)), b))
    F.sum(y * y).backward()
    xr, ar, br = (chainer.Variable(v.copy()) for v in (x0, a0, b0))
    yr = F.matmul(F.relu(F.matmul(xr, ar)), br)
    F.sum(yr * yr).backward()
    np.testing.assert_allclose(y.array, yr.array, rtol=1e-12)
    np.testing.assert_allclose(x.grad, xr.grad, rtol=1e-12)
    np.testing.assert_allclose(a.grad, part(ar.grad, mcomm, 1), rtol=1e-12)
    np.testing.assert_allclose(b.grad, part(br.grad, mcomm, 0), rtol=1e-12)


def test_scatter_then_gather_from_is_an_elementwise_product_in_parts(mcomm):
    x0, w0 = draw(2, 9, 3), draw(9, 3, seed=1)
    x, w = chainer.Variable(x0.copy()), chainer.Variable(part(w0, mcomm, 0).copy())
    y = M.gather_from_group(mcomm, F.tanh(M.scatter_to_group(mcomm, x, axis=1)) * w, axis=1)
    F.sum(y * y * y).backward()
    xr, wr = chainer.Variable(x0.copy()), chainer.Variable(w0.copy())
    yr = F.tanh(xr) * wr
    F.sum(yr * yr * yr).backward()
    np.testing.assert_allclose(y.array, yr.array, rtol=1e-12)
    np.testing.assert_allclose(x.grad, xr.grad, rtol=1e-12)
    np.testing.assert_allclose(w.grad, part(wr.grad, mcomm, 0), rtol=1e-12)


def test_sequence_parallel_gather_to_and_reduce_scatter_from(mcomm):
    """Rows cut over the ranks: ``gather_to`` before a column split, ``reduce_scatter_from``
    after a row split, ``gather_from`` for a loss every rank holds."""
    x0, a0, b0 = draw(7, 4), draw(4, 6, seed=1), draw(6, 4, seed=2)
    x = chainer.Variable(part(x0, mcomm, 0).copy())
    a, b = (chainer.Variable(v.copy()) for v in (part(a0, mcomm, 1), part(b0, mcomm, 0)))
    h = F.matmul(F.relu(F.matmul(M.gather_to_group(mcomm, x, axis=0), a)), b)
    y = M.reduce_scatter_from_group(mcomm, h, axis=0) + x  # a residual in parts
    whole = M.gather_from_group(mcomm, y, axis=0)
    F.sum(F.sin(whole)).backward()
    xr, ar, br = (chainer.Variable(v.copy()) for v in (x0, a0, b0))
    yr = F.matmul(F.relu(F.matmul(xr, ar)), br) + xr
    F.sum(F.sin(yr)).backward()
    np.testing.assert_allclose(whole.array, yr.array, rtol=1e-12)
    np.testing.assert_allclose(x.grad, part(xr.grad, mcomm, 0), rtol=1e-12)
    np.testing.assert_allclose(a.grad, part(ar.grad, mcomm, 1), rtol=1e-12)
    np.testing.assert_allclose(b.grad, part(br.grad, mcomm, 0), rtol=1e-12)


def test_given_bounds_cut_where_they_say(mcomm):
    extent = 2 * mcomm.size + 1
    bounds = [0] + [2 * (r + 1) for r in range(mcomm.size - 1)] + [extent]
    x = chainer.Variable(draw(3, extent))
    y = M.scatter_to_group(mcomm, x, axis=1, bounds=bounds)
    np.testing.assert_array_equal(y.array, x.array[:, bounds[mcomm.rank]:bounds[mcomm.rank + 1]])
    z = M.reduce_scatter_from_group(mcomm, x, axis=-1, bounds=bounds)
    np.testing.assert_allclose(z.array, mcomm.size * y.array, rtol=1e-12)


def test_float32_and_float16_sum_in_their_dtype(mcomm):
    for dtype in (np.float32, np.float16):
        y = M.reduce_from_group(mcomm, np.full((2, 3), 0.5, dtype))
        assert y.dtype == dtype and np.all(y.array == 0.5 * mcomm.size)


def test_observers_see_every_collective_once_per_phase(mcomm):
    seen = []

    def observe(node, op, phase):
        seen.append((node.op, op, phase))

    _conjugate.observers.append(observe)
    try:
        x = chainer.Variable(draw(4, 6))
        y = M.gather_from_group(mcomm, M.scatter_to_group(mcomm, M.copy_to_group(mcomm, x)))
        z = M.reduce_from_group(mcomm, y) + M.reduce_scatter_from_group(mcomm, y, axis=0)[0]
        F.sum(z).backward()
    finally:
        _conjugate.observers.remove(observe)
    if mcomm.size == 1:
        assert seen == []  # a group of one rank talks to nobody
        return
    assert {s[0] for s in seen if s[1] == ""} == {"copy_to_group", "scatter_to_group"}
    forward = [s for s in seen if s[2] == "forward" and s[1]]
    backward = [s for s in seen if s[2] == "backward"]
    assert forward == [("gather_from_group", "allgather", "forward"),
                       ("reduce_from_group", "allreduce", "forward"),
                       ("reduce_scatter_from_group", "reduce_scatter", "forward")]
    assert sorted(backward) == [("copy_to_group", "allreduce", "backward"),
                                ("reduce_scatter_from_group", "allgather", "backward"),
                                ("scatter_to_group", "allgather", "backward")]


def test_one_copy_sums_the_gradients_of_several_values_in_one_allreduce(mcomm):
    seen = []
    _conjugate.observers.append(lambda node, op, phase: seen.append(op))
    try:
        a, b = chainer.Variable(draw(2, 3)), chainer.Variable(draw(4, seed=1).astype(np.float32))
        ca, cb = _conjugate.CopyToGroup(mcomm).apply((a, b))
        F.sum(ca * (mcomm.rank + 1)).backward()
        F.sum(cb * 2).backward()
    finally:
        _conjugate.observers.pop()
    whole = mcomm.size * (mcomm.size + 1) / 2
    np.testing.assert_allclose(a.grad, np.full((2, 3), whole))
    np.testing.assert_allclose(b.grad, np.full(4, 2 * mcomm.size))
    assert seen.count("allreduce") == (2 if mcomm.size > 1 else 0)  # one per backward


def test_a_value_without_a_gradient_is_not_copied(mcomm):
    x = np.ones((2, 2))
    y = M.copy_to_group(mcomm, x)
    assert y.array is x and y.creator is None


@pytest.mark.mpi(min_size=2)
def test_arrays_that_do_not_fit_together_are_refused_on_every_rank(mcomm):
    shape = (2, 3) if mcomm.rank == 0 else (3, 3)
    with pytest.raises(ValueError, match=r"mnpar.functions.reduce_from_group needs arrays of "
                                         r"one shape and dtype on every rank of its group; got "
                                         r"rank 0: float64 \(2, 3\), rank 1: float64 \(3, 3\)"):
        M.reduce_from_group(mcomm, np.ones(shape))
    with pytest.raises(ValueError, match=r"gather_from_group needs arrays that differ along "
                                         r"axis 1 alone \(shown as -1\) on every rank of its "
                                         r"group; got rank 0: float64 \(-1, 2\), rank 1: "
                                         r"float64 \(-1, 3\)"):
        M.gather_from_group(mcomm, np.ones((2, 1) if mcomm.rank == 0 else (3, 2)), axis=1)
    dtype = np.float32 if mcomm.rank == 0 else np.float64
    x = chainer.Variable(np.ones((2, 2), dtype))
    with pytest.raises(ValueError, match=r"reduce_scatter_from_group needs arrays of one shape "
                                         r"and dtype.*rank 0: float32 \(2, 2\), rank 1: float64"):
        M.reduce_scatter_from_group(mcomm, x, axis=0, bounds=[0] + [2] * mcomm.size)
    assert M.reduce_from_group(mcomm, np.ones(3)).array[0] == mcomm.size  # still in step


def test_misuse_is_refused(mcomm):
    x = np.ones((2, 3))
    with pytest.raises(TypeError, match="copy_to_group needs an mnpar communicator, not "
                                        "Intracomm"):
        M.copy_to_group(mcomm.mpi_comm, x)
    with pytest.raises(TypeError, match="gather_to_group: x must be a Variable or an array, "
                                        "not list"):
        M.gather_to_group(mcomm, [1, 2])
    with pytest.raises(ValueError, match=r"scatter_to_group: axis 2 is out of range for an "
                                         r"array of 2 axes \(shape \(2, 3\)\)"):
        M.scatter_to_group(mcomm, x, axis=2)
    with pytest.raises(TypeError, match="axis must be an int, not 1.0"):
        M.gather_from_group(mcomm, x, axis=1.0)
    with pytest.raises(ValueError, match=r"bounds \(0, 5\) must rise from 0 to the axis' "
                                         r"extent 3"):
        M.scatter_to_group(mcomm, x, axis=1, bounds=(0, 5))
    with pytest.raises(ValueError, match=rf"an axis of {mcomm.size - 1} cannot be cut into "
                                         rf"{mcomm.size} parts of at least one each"):
        M.reduce_scatter_from_group(mcomm, np.ones((mcomm.size - 1, 2)), axis=0)
