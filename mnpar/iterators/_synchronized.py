"""The synchronized iterator: every rank shuffles its own copy the same way.

Instead of sending batches (``create_multi_node_iterator``), every rank
holds the dataset and shuffles with one seed drawn by rank 0. The order
sampler is :class:`mnpar.extensions.ResumableShuffleOrderSampler`, whose
next order follows from the seed and the current order alone, so ranks
resumed from their snapshots keep shuffling alike (chainer's
``ShuffleOrderSampler`` keeps a random state that snapshots do not save).
"""
from typing import Any

import numpy as np

from ..communicators._facade import Communicator, require_communicator
from ..extensions import ResumableShuffleOrderSampler


def create_synchronized_iterator(actual_iterator: Any, communicator: Communicator) -> Any:
    """Makes every rank's ``actual_iterator`` shuffle alike; collective.

    Args:
        actual_iterator: an iterator with an ``order_sampler`` (e.g.
            ``chainer.iterators.SerialIterator``) over the same dataset on
            every rank.
        communicator: an mnpar communicator.

    Returns:
        ``actual_iterator`` itself, reset, with a shared order sampler.

    Raises:
        TypeError: ``communicator`` is not an mnpar communicator.
        ValueError: the iterator has no ``order_sampler``.

    Example::

        it = mnpar.iterators.create_synchronized_iterator(
            chainer.iterators.SerialIterator(train, 32), comm)
    """
    require_communicator(communicator, "create_synchronized_iterator")
    if not hasattr(actual_iterator, "order_sampler"):
        raise ValueError(f"actual_iterator must have order_sampler; "
                         f"{type(actual_iterator).__name__} has none")
    seed = int(np.random.randint(0, 2 ** 31 - 1)) if communicator.rank == 0 else None
    seed = communicator.bcast_obj(seed, root=0)
    actual_iterator.order_sampler = ResumableShuffleOrderSampler(seed)
    actual_iterator.reset()
    return actual_iterator
