"""Array collectives: each equals its definition at every rank count."""
import numpy as np
import pytest

import mnpar

pytestmark = pytest.mark.mpi(min_size=1)


def value(rank, shape=(2, 3), dtype=np.float64):
    return (np.arange(np.prod(shape)).reshape(shape) + 10 * rank).astype(dtype)


@pytest.mark.parametrize("root", [0, -1])
def test_bcast(comm, root):
    root = root % comm.size
    got = comm.bcast(value(comm.rank, dtype=np.float16), root=root)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, value(root, dtype=np.float16))


def test_bcast_ignores_data_on_other_ranks(comm):
    got = comm.bcast(value(0) if comm.rank == 0 else None)
    np.testing.assert_array_equal(got, value(0))


def test_gather_to_last_rank(comm):
    root = comm.size - 1
    got = comm.gather(value(comm.rank, (comm.rank + 1,), np.int32), root=root)
    if comm.rank == root:
        assert len(got) == comm.size
        for r, g in enumerate(got):
            np.testing.assert_array_equal(g, value(r, (r + 1,), np.int32))
    else:
        assert got is None


def test_scatter_from_tuple_and_from_array(comm):
    parts = tuple(value(r, (r + 1, 2)) for r in range(comm.size))
    got = comm.scatter(parts if comm.rank == 0 else None)
    np.testing.assert_array_equal(got, value(comm.rank, (comm.rank + 1, 2)))
    stacked = np.arange(comm.size * 3.0).reshape(comm.size, 3)
    np.testing.assert_array_equal(comm.scatter(stacked), stacked[comm.rank])


def test_allgather(comm):
    got = comm.allgather(value(comm.rank, (2,), np.complex64))
    assert [g.dtype for g in got] == [np.complex64] * comm.size
    for r, g in enumerate(got):
        np.testing.assert_array_equal(g, value(r, (2,), np.complex64))


def test_alltoall(comm):
    xs = tuple(np.array([comm.rank * 100 + j]) for j in range(comm.size))
    got = comm.alltoall(xs)
    assert [int(g[0]) for g in got] == [i * 100 + comm.rank for i in range(comm.size)]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.complex128])
def test_allreduce_sums(comm, dtype):
    got = comm.allreduce(value(comm.rank, dtype=dtype))
    want = sum(value(r, dtype=np.float64) for r in range(comm.size)).astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


def test_allreduce_leaves_input_untouched(comm):
    x = np.ones(3)
    comm.allreduce(x)
    np.testing.assert_array_equal(x, np.ones(3))


@pytest.mark.mpi(min_size=2)
def test_allreduce_with_different_shapes_fails_on_every_rank(comm):
    with pytest.raises(ValueError, match=r"same dtype and shape on every rank; got rank 0: "
                                         r"float64 \(1,\), rank 1: float64 \(2,\)"):
        comm.allreduce(np.ones(comm.rank + 1))


@pytest.mark.parametrize("call, error, match", [
    (lambda c: c.bcast(np.ones(1), root=c.size), ValueError, "root=.* out of range"),
    (lambda c: c.gather((np.ones(1), np.ones(1))), TypeError, "x must be one array"),
    (lambda c: c.allreduce(np.ones(2, bool)), TypeError, "bool array cannot be summed"),
    (lambda c: c.alltoall([np.ones(1)] * (c.size + 1)), ValueError, "one array per rank"),
    (lambda c: c.allgather("x"), TypeError, "not str"),
])
def test_bad_input(comm, call, error, match):
    with pytest.raises(error, match=match):
        call(comm)


@pytest.mark.mpi(min_size=2)
def test_scatter_with_wrong_part_count_fails_on_root():
    comm = mnpar.create_communicator("naive", timeout=5)
    if comm.rank == 0:
        with pytest.raises(ValueError, match=r"got 1 parts for a communicator of size"):
            comm.scatter((np.ones(1),))
    comm.finalize()


def test_object_collectives(comm):
    assert comm.bcast_obj({"r": comm.rank} if comm.rank == 0 else None) == {"r": 0}
    gathered = comm.gather_obj(comm.rank, root=0)
    assert gathered == (list(range(comm.size)) if comm.rank == 0 else None)
    assert comm.allgather_obj(comm.rank) == list(range(comm.size))
    assert comm.allreduce_obj(comm.rank + 1) == comm.size * (comm.size + 1) // 2
