"""scatter_dataset and scatter_index: ChainerMN's split, each rank only its part."""
import warnings

import chainer
import numpy as np
import pytest

import mnpar

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from chainermn.datasets.scatter import _scatter_index as chainermn_ranges


def expected(comm, n, force_equal_length, order=None):
    order = np.arange(n) if order is None else order
    ranges = [(b, e) for _, b, e in chainermn_ranges(n, comm.size, force_equal_length)]
    b, e = ranges[comm.rank]
    return order[b:e]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("n", [0, 1, 7, 12])
@pytest.mark.parametrize("force_equal_length", [True, False])
def test_scatter_index_splits_as_chainermn_does(comm, n, force_equal_length):
    b, e = mnpar.datasets.scatter_index(n if comm.rank == 0 else -5, comm,
                                        force_equal_length=force_equal_length)
    np.testing.assert_array_equal(np.arange(b, e), expected(comm, n, force_equal_length))
    lengths = comm.allgather_obj(e - b)
    if force_equal_length:
        assert len(set(lengths)) == 1
    else:
        assert sum(lengths) == n


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("force_equal_length", [True, False])
def test_every_example_reaches_a_rank_and_only_equal_lengths_repeat(comm, force_equal_length):
    data = list(range(10 * comm.size + 1))  # uneven
    mine = mnpar.scatter_dataset(data if comm.rank == 0 else None, comm,
                                 force_equal_length=force_equal_length)
    everything = [x for part in comm.allgather_obj(list(mine)) for x in part]
    assert sorted(set(everything)) == data
    assert (len(everything) > len(data)) == (force_equal_length and comm.size > 1)


@pytest.mark.mpi(min_size=1)
def test_shuffle_with_a_seed_puts_examples_on_the_same_rank_every_time(comm):
    data = np.arange(50, dtype=np.float32).reshape(25, 2)
    mine = mnpar.scatter_dataset(data, comm, shuffle=True, seed=3)
    again = mnpar.scatter_dataset(data, comm, shuffle=True, seed=3)
    order = np.random.RandomState(3).permutation(25)
    assert isinstance(mine, np.ndarray)
    np.testing.assert_array_equal(mine, data[expected(comm, 25, True, order)])
    np.testing.assert_array_equal(again, mine)


@pytest.mark.mpi(min_size=1)
def test_tuple_dataset_stays_a_tuple_dataset_of_arrays(comm):
    x = np.arange(30, dtype=np.float32).reshape(15, 2)
    t = np.arange(15, dtype=np.int32)
    mine = mnpar.scatter_dataset(chainer.datasets.TupleDataset(x, t), comm, root=comm.size - 1)
    idx = expected(comm, 15, True)
    assert isinstance(mine, chainer.datasets.TupleDataset)
    xs, ts = chainer.dataset.concat_examples(mine)
    np.testing.assert_array_equal(xs, x[idx])
    np.testing.assert_array_equal(ts, t[idx])


@pytest.mark.mpi(min_size=1)
def test_large_parts_travel_in_chunks_of_max_buf_len(comm):
    data = [("example", i, np.full(100, i)) for i in range(40)]
    mine = mnpar.scatter_dataset(data if comm.rank == 0 else None, comm, max_buf_len=97)
    idx = expected(comm, 40, True)
    assert [m[1] for m in mine] == list(idx)
    np.testing.assert_array_equal(mine[-1][2], np.full(100, idx[-1]))


@pytest.mark.mpi(min_size=1)
def test_empty_dataset_gives_every_rank_an_empty_part(comm):
    assert len(mnpar.scatter_dataset([], comm)) == 0
    assert mnpar.scatter_dataset(np.zeros((0, 3)), comm).shape == (0, 3)


@pytest.mark.mpi(min_size=2)
def test_fewer_examples_than_ranks_leaves_some_ranks_empty_without_equal_length(comm):
    mine = mnpar.scatter_dataset(["only"], comm, force_equal_length=False)
    assert list(mine) == (["only"] if comm.rank == 0 else [])
    assert list(mnpar.scatter_dataset(["only"], comm)) == ["only"]  # repeated everywhere


@pytest.mark.mpi(min_size=1)
def test_no_dataset_on_root_is_an_error_on_every_rank(comm):
    with pytest.raises(ValueError, match="the dataset on root rank 0 is None"):
        mnpar.scatter_dataset(None, comm)
    with pytest.raises(ValueError, match="max_buf_len=0 must be a positive"):
        mnpar.scatter_dataset([1], comm, max_buf_len=0)


def test_an_mpi4py_communicator_is_refused_with_a_hint(world):
    with pytest.raises(TypeError, match=r"needs an mnpar communicator, not Intracomm; wrap"):
        mnpar.scatter_dataset([1, 2], world)
    with pytest.raises(TypeError, match="scatter_index needs an mnpar communicator"):
        mnpar.datasets.scatter_index(2, world)
