"""scatter_dataset and scatter_index: ChainerMN's results, each rank sent only its part."""
import inspect
import warnings
from collections import Counter

import chainer
import numpy as np
import pytest
from chainer.datasets import DictDataset, SubDataset, TupleDataset
from helpers import chainermn_and_comm

import mnpar


@pytest.fixture(scope="module")
def cmn():
    """ChainerMN and its communicator over the world, to build its result beside ours."""
    return chainermn_and_comm()


def chainermn_scatter(cmn, dataset, **kwargs):
    chainermn, comm = cmn
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return chainermn.scatter_dataset(dataset, comm, **kwargs)


class Squares(chainer.dataset.DatasetMixin):
    """A dataset that builds each example when it is read."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def get_example(self, i):
        return np.full(2, i * i, np.float32), i


class Counted(chainer.dataset.DatasetMixin):
    """Each read of example ``i`` returns how often ``i`` has been read on this rank."""

    def __init__(self, n):
        self.n = n
        self.reads = Counter()

    def __len__(self):
        return self.n

    def get_example(self, i):
        self.reads[i] += 1
        return self.reads[i]


def make(kind, n):
    x = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
    t = np.arange(n, dtype=np.int32)
    return {
        "list": lambda: [f"example {i}" for i in range(n)],
        "list of tuples": lambda: [(x[i], int(t[i])) for i in range(n)],
        "tuple": lambda: tuple(range(n)),
        "2-d ndarray": lambda: x,
        "1-d ndarray": lambda: t,
        "TupleDataset": lambda: TupleDataset(x, t),
        "TupleDataset with a list": lambda: TupleDataset(x, list(range(n))),
        "DictDataset": lambda: DictDataset(x=x, t=t),
        "DatasetMixin": lambda: Squares(n),
        "SubDataset": lambda: chainer.datasets.split_dataset(TupleDataset(x, t), n // 2)[1],
    }[kind]()


KINDS = ["list", "list of tuples", "tuple", "2-d ndarray", "1-d ndarray", "TupleDataset",
         "TupleDataset with a list", "DictDataset", "DatasetMixin", "SubDataset"]


def assert_same_example(mine, theirs):
    assert type(mine) is type(theirs)
    if isinstance(theirs, (np.ndarray, np.generic)):
        assert mine.dtype == theirs.dtype
        np.testing.assert_array_equal(mine, theirs)
    elif isinstance(theirs, (tuple, list)):
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            assert_same_example(a, b)
    elif isinstance(theirs, dict):
        assert mine.keys() == theirs.keys()
        for key in theirs:
            assert_same_example(mine[key], theirs[key])
    else:
        assert mine == theirs


def assert_same_dataset(mine, theirs):
    """Same type, length, items, slices, index lists and out-of-range errors."""
    assert type(mine) is type(theirs) is SubDataset
    n = len(theirs)
    assert len(mine) == n
    for i in range(-n, n):
        assert_same_example(mine[i], theirs[i])
    for index in [slice(None), slice(1, 3), slice(None, None, -1), slice(-2, None),
                  [0, n - 1] if n else [], np.arange(n)[::2]]:
        got = mine[index]
        assert isinstance(got, list)
        assert_same_example(got, theirs[index])
    for i in (n, -n - 1):
        with pytest.raises(IndexError):
            mine[i]


@pytest.mark.chainermn
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1, 7, 12])
def test_every_rank_gets_what_chainermn_gives_it(comm, cmn, kind, n):
    for root in range(comm.size):
        for shuffle, seed in [(False, None), (True, 3)]:
            for force_equal_length in [True, False]:
                kwargs = dict(root=root, shuffle=shuffle, seed=seed,
                              force_equal_length=force_equal_length)
                mine = mnpar.scatter_dataset(make(kind, n) if comm.rank == root else None,
                                             comm, **kwargs)
                theirs = chainermn_scatter(cmn, make(kind, n) if comm.rank == root else None,
                                           **kwargs)
                assert_same_dataset(mine, theirs)


@pytest.mark.chainermn
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["2-d ndarray", "TupleDataset", "list"])
def test_joining_the_shards_gives_back_every_example(comm, cmn, kind):
    # Issue 14: shards of an array dataset sliced to ndarrays, so sum(..., []) lost data.
    data = make(kind, 10 * comm.size + 1)
    mine = mnpar.scatter_dataset(data, comm, force_equal_length=False)
    theirs = chainermn_scatter(cmn, data, force_equal_length=False)
    joined = sum((d[:] for d in comm.allgather_obj(mine)), [])
    assert len(joined) == len(data)
    assert_same_example(joined, sum((d[:] for d in comm.allgather_obj(theirs)), []))


@pytest.mark.chainermn
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("n", [0, 1, 7, 12])
@pytest.mark.parametrize("force_equal_length", [True, False])
def test_scatter_index_splits_as_chainermn_does(comm, cmn, n, force_equal_length):
    chainermn, ccomm = cmn
    for root in range(comm.size):
        mine = mnpar.datasets.scatter_index(n if comm.rank == root else -5, comm, root,
                                            force_equal_length=force_equal_length)
        theirs = chainermn.datasets.scatter_index(n if comm.rank == root else -5, ccomm, root,
                                                  force_equal_length=force_equal_length)
        assert mine == theirs
        assert type(mine) is tuple and all(type(x) is int for x in mine)
    lengths = comm.allgather_obj(mine[1] - mine[0])
    if force_equal_length:
        assert len(set(lengths)) == 1
    else:
        assert sum(lengths) == n


@pytest.mark.chainermn
def test_signatures_are_chainermns():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import chainermn

    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert params(mnpar.scatter_dataset) == params(chainermn.scatter_dataset)
    assert params(mnpar.datasets.scatter_index) == params(chainermn.datasets.scatter_index)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("force_equal_length", [True, False])
def test_every_example_reaches_a_rank_and_only_equal_lengths_repeat(comm, force_equal_length):
    data = list(range(10 * comm.size + 1))  # uneven
    mine = mnpar.scatter_dataset(data if comm.rank == 0 else None, comm,
                                 force_equal_length=force_equal_length)
    everything = [x for part in comm.allgather_obj(mine[:]) for x in part]
    assert sorted(set(everything)) == data
    assert (len(everything) > len(data)) == (force_equal_length and comm.size > 1)


@pytest.mark.mpi(min_size=1)
def test_shuffle_with_a_seed_puts_examples_on_the_same_rank_every_time(comm):
    data = np.arange(50, dtype=np.float32).reshape(25, 2)
    mine = mnpar.scatter_dataset(data, comm, shuffle=True, seed=3)
    again = mnpar.scatter_dataset(data, comm, shuffle=True, seed=3)
    b, e = mnpar.datasets.scatter_index(25, comm)
    order = np.random.RandomState(3).permutation(25)
    np.testing.assert_array_equal(mine[:], data[order[b:e]])
    np.testing.assert_array_equal(again[:], mine[:])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("make_data", [
    lambda: [("example", i, np.full(100, i)) for i in range(40)],
    lambda: Squares(40),
], ids=["cut", "whole"])
def test_large_datasets_travel_in_chunks_of_max_buf_len(comm, make_data):
    mine = mnpar.scatter_dataset(make_data() if comm.rank == 0 else None, comm, max_buf_len=97)
    b, e = mnpar.datasets.scatter_index(40, comm)
    data = make_data()
    assert [m[1] for m in mine[:]] == list(range(b, e))
    assert_same_example(mine[:], [data[i] for i in range(b, e)])


@pytest.mark.mpi(min_size=1)
def test_a_dataset_built_on_access_is_read_lazily_on_every_rank(comm):
    # As in ChainerMN: random augmentation stays random, and root reads no example.
    data = Counted(3 * comm.size)
    mine = mnpar.scatter_dataset(data if comm.rank == 0 else None, comm)
    assert not data.reads
    assert (mine[0], mine[0], mine[-1]) == (1, 2, 1)


@pytest.mark.mpi(min_size=1)
def test_empty_dataset_gives_every_rank_an_empty_part(comm):
    for data in ([], np.zeros((0, 3)), TupleDataset(np.zeros((0, 3)), [])):
        mine = mnpar.scatter_dataset(data, comm)
        assert type(mine) is SubDataset and len(mine) == 0 and mine[:] == []


@pytest.mark.mpi(min_size=2)
def test_fewer_examples_than_ranks_leaves_some_ranks_empty_without_equal_length(comm):
    mine = mnpar.scatter_dataset(["only"], comm, force_equal_length=False)
    assert mine[:] == (["only"] if comm.rank == 0 else [])
    assert mnpar.scatter_dataset(["only"], comm)[:] == ["only"]  # repeated everywhere


@pytest.mark.mpi(min_size=1)
def test_bad_datasets_on_root_are_an_error_on_every_rank(comm):
    root = comm.size - 1
    with pytest.raises(ValueError, match=f"the dataset on root rank {root} is None"):
        mnpar.scatter_dataset(None, comm, root=root)
    with pytest.raises(ValueError, match="max_buf_len=0 must be a positive"):
        mnpar.scatter_dataset([1], comm, max_buf_len=0)
    with pytest.raises(TypeError, match=rf"on root rank {root} \(TransformDataset\) cannot be "
                                        "pickled .*define its functions at module level"):
        mnpar.scatter_dataset(chainer.datasets.TransformDataset([1, 2], lambda x: x)
                              if comm.rank == root else None, comm, root=root)


def test_an_mpi4py_communicator_is_refused_with_a_hint(world):
    with pytest.raises(TypeError, match=r"needs an mnpar communicator, not Intracomm; wrap"):
        mnpar.scatter_dataset([1, 2], world)
    with pytest.raises(TypeError, match="scatter_index needs an mnpar communicator"):
        mnpar.datasets.scatter_index(2, world)
