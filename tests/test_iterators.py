"""Multi-node and synchronized iterators: every rank sees the same batches."""
import chainer
import numpy as np
import pytest

import mnpar


def data():
    return [(np.full(2, i, np.float32), np.int32(i)) for i in range(10)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("master", [0, -1])
def test_every_rank_gets_the_master_batches(comm, master):
    master = master % comm.size
    actual = (chainer.iterators.SerialIterator(data(), 4, shuffle=True)
              if comm.rank == master else None)
    it = mnpar.iterators.create_multi_node_iterator(actual, comm, rank_master=master)
    for _ in range(5):  # past the end of the first epoch
        batch = next(it)
        assert comm.allgather_obj([int(t) for _, t in batch]) == \
            [[int(t) for _, t in batch]] * comm.size
        states = comm.allgather_obj((it.epoch, it.is_new_epoch, it.epoch_detail))
        assert states == [states[master]] * comm.size
    assert it.epoch == 2


@pytest.mark.mpi(min_size=1)
def test_a_finite_iterator_stops_on_every_rank(comm):
    actual = chainer.iterators.SerialIterator(data(), 4, repeat=False, shuffle=False)
    it = mnpar.iterators.create_multi_node_iterator(actual if comm.rank == 0 else None, comm)
    sizes = [len(b) for b in it]
    assert sizes == [4, 4, 2]


@pytest.mark.mpi(min_size=2)
def test_an_error_in_the_master_iterator_is_raised_on_every_rank(comm):
    class Broken(chainer.dataset.Iterator):
        epoch, is_new_epoch, current_position = 0, False, 0

        def __next__(self):
            raise OSError("disk gone")

    it = mnpar.iterators.create_multi_node_iterator(Broken() if comm.rank == 0 else None, comm)
    with pytest.raises(RuntimeError, match=r"master \(rank 0\) failed: OSError\('disk gone'\)"):
        next(it)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("example", ["text", 3, [np.ones(2)], (np.ones(2), "label")])
def test_examples_that_are_not_arrays_are_a_type_error_on_every_rank(comm, example):
    # As ChainerMN's (its test_multi_node_iterator's test_invalid_type).
    actual = chainer.iterators.SerialIterator([example] * 4, 2) if comm.rank == 0 else None
    it = mnpar.iterators.create_multi_node_iterator(actual, comm)
    with pytest.raises(TypeError, match="takes examples that are arrays, or tuples or dicts"):
        next(it)


@pytest.mark.mpi(min_size=1)
def test_tuples_and_dicts_of_arrays_of_any_dtype_travel(comm):
    examples = [(np.full(2, i, np.float64), np.int32(i), np.bool_(i % 2)) for i in range(4)]
    examples += [{"x": np.ones(1, np.float16), "t": np.int64(i)} for i in range(4)]
    actual = chainer.iterators.SerialIterator(examples, 4, shuffle=False) \
        if comm.rank == 0 else None
    it = mnpar.iterators.create_multi_node_iterator(actual, comm)
    first, second = next(it), next(it)
    assert [e[1].dtype for e in first] == [np.int32] * 4 and first[0][0].dtype == np.float64
    assert [e["t"] for e in second] == [0, 1, 2, 3] and second[0]["x"].dtype == np.float16


def test_rank_master_out_of_range(comm):
    with pytest.raises(ValueError, match="rank_master=5 is out of range"):
        mnpar.iterators.create_multi_node_iterator(None, comm, rank_master=5)
    with pytest.raises(TypeError, match="rank_master must be an int rank, not str '0'"):
        mnpar.iterators.create_multi_node_iterator(None, comm, rank_master="0")


@pytest.mark.mpi(min_size=1)
def test_synchronized_iterators_shuffle_alike(comm):
    np.random.seed(comm.rank)  # the ranks' own random states differ
    it = chainer.iterators.SerialIterator(data(), 3, shuffle=True)
    it = mnpar.iterators.create_synchronized_iterator(it, comm)
    seen = [[int(t) for _, t in next(it)] for _ in range(8)]
    assert comm.allgather_obj(seen) == [seen] * comm.size
    assert sorted(sum(seen[:3], []) + seen[3][:1]) == list(range(10))


def test_synchronized_needs_an_order_sampler(comm):
    with pytest.raises(ValueError, match="must have order_sampler"):
        mnpar.iterators.create_synchronized_iterator(iter([]), comm)


@pytest.mark.mpi(min_size=1)
def test_snapshot_of_each_rank_restores_its_position(comm):
    def make():
        actual = chainer.iterators.SerialIterator(data(), 4, shuffle=False)
        return mnpar.iterators.create_multi_node_iterator(
            actual if comm.rank == 0 else None, comm)

    it = make()
    for _ in range(3):
        next(it)
    saved = {}
    it.serialize(chainer.serializers.DictionarySerializer(saved))
    resumed = make()
    resumed.serialize(chainer.serializers.NpzDeserializer(saved))
    assert (resumed.epoch, resumed.current_position) == (1, 2)
    assert [int(t) for _, t in next(resumed)] == [2, 3, 4, 5]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("cls", [chainer.iterators.SerialIterator,
                                 chainer.iterators.MultiprocessIterator])
def test_a_follower_snapshot_loads_into_a_plain_iterator(comm, cls):
    # Regression: a follower saved no order, so loading its snapshot into a
    # chainer iterator failed with KeyError: '_order' (ChainerMN's
    # test_iterator_compatibility); the order saved must be the master's.
    dataset = np.arange(6, dtype=np.float32)
    actual = cls(dataset, 2, shuffle=True) if comm.rank == 0 else None
    it = mnpar.iterators.create_multi_node_iterator(actual, comm)
    seen = next(it) + next(it)
    saved = {}
    it.serialize(chainer.serializers.DictionarySerializer(saved))
    plain = cls(dataset, 2, shuffle=True)
    plain.serialize(chainer.serializers.NpzDeserializer(saved))
    assert (plain.epoch_detail, plain.is_new_epoch) == (pytest.approx(4 / 6), False)
    rest = next(plain)
    assert plain.is_new_epoch and sorted(seen + rest) == dataset.tolist()
    assert comm.allgather_obj(rest) == [rest] * comm.size
    if actual is not None:
        actual.finalize()
    plain.finalize()


@pytest.mark.mpi(min_size=2)
def test_the_order_follows_the_master_over_epochs_and_loads(comm):
    actual = chainer.iterators.SerialIterator(data(), 4, shuffle=True) if comm.rank == 0 else None
    it = mnpar.iterators.create_multi_node_iterator(actual, comm)
    for _ in range(3):  # into the second epoch (10 samples, 4 a batch): a new order
        next(it)
        order = it._state.order if comm.rank == 0 else it._order
        assert [o.tolist() for o in comm.allgather_obj(order)] == [order.tolist()] * comm.size
    saved = {}
    it.serialize(chainer.serializers.DictionarySerializer(saved))
    saved["order"] = np.roll(saved["order"], 1)  # only the master can change the order
    it.serialize(chainer.serializers.NpzDeserializer(saved))
    next(it)  # still in the second epoch
    order = it._state.order if comm.rank == 0 else it._order
    assert [o.tolist() for o in comm.allgather_obj(order)] == [saved["order"].tolist()] * comm.size
