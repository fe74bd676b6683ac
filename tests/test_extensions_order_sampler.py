"""ResumableShuffleOrderSampler: seeded orders that survive a snapshot."""
import chainer
import numpy as np
import pytest
from chainer import serializers

from mnpar.extensions import ResumableShuffleOrderSampler


def epochs(sampler, n, count):
    order, out = np.arange(n), []
    for _ in range(count):
        order = sampler(order, 0)
        out.append(order)
    return out


def test_every_order_is_a_permutation_and_epochs_differ():
    orders = epochs(ResumableShuffleOrderSampler(0), 50, 5)
    for order in orders:
        assert sorted(order.tolist()) == list(range(50))
    assert len({o.tobytes() for o in orders}) == 5


def test_same_seed_same_orders_other_seed_other_orders():
    a = epochs(ResumableShuffleOrderSampler(7), 30, 3)
    b = epochs(ResumableShuffleOrderSampler(7), 30, 3)
    c = epochs(ResumableShuffleOrderSampler(8), 30, 3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])


def test_an_iterator_restored_from_a_snapshot_continues_the_same_batches():
    data = list(range(10))

    def iterator():
        return chainer.iterators.SerialIterator(
            data, 3, order_sampler=ResumableShuffleOrderSampler(5))

    whole = iterator()
    for _ in range(4):
        whole.next()
    saved = serializers.DictionarySerializer()
    saved.save(whole)
    restored = iterator()
    restored.serialize(serializers.NpzDeserializer(saved.target))
    assert [restored.next() for _ in range(10)] == [whole.next() for _ in range(10)]


def test_rejects_a_bad_seed():
    with pytest.raises(TypeError, match="seed must be an int, not float 1.5"):
        ResumableShuffleOrderSampler(1.5)
    with pytest.raises(ValueError, match="seed=-1 must be non-negative"):
        ResumableShuffleOrderSampler(-1)
