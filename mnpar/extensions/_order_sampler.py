"""A shuffling order sampler that a resumed run continues exactly.

chainer's ``ShuffleOrderSampler`` draws each epoch's order from a
``RandomState`` that no snapshot saves, so a resumed run shuffles
differently from the run it continues. This sampler keeps no state at all:
the next order is a function of the seed and the current order, and the
current order is part of the iterator's snapshot::

    order_1 = f(seed, arange(n))   order_2 = f(seed, order_1)   ...

The same seed gives the same sequence of orders on every rank, in every run.
"""
import hashlib
import numbers
from typing import Any

import numpy as np
from chainer.iterators.order_samplers import OrderSampler


class ResumableShuffleOrderSampler(OrderSampler):
    """Shuffles each epoch from ``seed`` and the previous epoch's order.

    Args:
        seed: a non-negative int; ranks and runs with the same seed see the
            same orders.

    Raises:
        TypeError: ``seed`` is not an int.
        ValueError: ``seed`` is negative.

    Example::

        sampler = mnpar.extensions.ResumableShuffleOrderSampler(seed=0)
        it = chainer.iterators.SerialIterator(train, 32, order_sampler=sampler)
    """

    def __init__(self, seed: int) -> None:
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, not {type(seed).__name__} {seed!r}")
        if seed < 0:
            raise ValueError(f"seed={seed} must be non-negative")
        self.seed: int = int(seed)

    def __call__(self, current_order: Any, current_position: int) -> np.ndarray:
        order = np.ascontiguousarray(np.asarray(current_order, dtype=np.int64))
        digest = hashlib.sha256(self.seed.to_bytes(16, "little") + order.tobytes()).digest()
        key = np.frombuffer(digest, dtype=np.uint32)
        return np.random.RandomState(key).permutation(len(order))
