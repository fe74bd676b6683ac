"""Scattering a dataset from one rank: each rank receives only its own examples.

ChainerMN broadcasts the whole dataset and lets every rank keep a
``SubDataset`` view of it. Here the root cuts the dataset first and sends
every rank just its part, pickled and moved in chunks of at most
``max_buf_len`` bytes by the communicator's ``scatter`` (one round per
chunk), so no single message is bigger than that and no rank holds more
than its share. Arrays and ``TupleDataset`` s of arrays are cut by fancy
indexing and stay arrays; other datasets become a list of their examples.

How ``n`` examples are split over ``size`` ranks (ChainerMN's rule)::

    force_equal_length=True   every rank gets ceil(n / size) examples, starting
                              at n * rank // size (neighbours may overlap)
    force_equal_length=False  the first n % size ranks get one more; no overlap
"""
import pickle
from typing import Any, Iterator, List, Optional, Tuple

import chainer
import numpy as np

from ..communicators._communicator import require_communicator

DEFAULT_MAX_BUF_LEN = 256 * 1024 * 1024


def _ranges(n: int, size: int, force_equal_length: bool) -> Iterator[Tuple[int, int]]:
    if force_equal_length:
        length = -(-n // size)
        for i in range(size):
            b = n * i // size
            yield b, b + length
        return
    b = 0
    for i in range(size):
        e = b + n // size + (1 if i < n % size else 0)
        yield b, e
        b = e


def scatter_index(n_total_samples: int, comm: Any, root: int = 0, *,
                  force_equal_length: bool = True) -> Tuple[int, int]:
    """This rank's ``(begin, end)`` offsets of ``n_total_samples`` examples; collective.

    Only ``root``'s ``n_total_samples`` counts.

    Args:
        n_total_samples: the number of examples (read on ``root``).
        comm: an mnpar communicator.
        root: the rank whose count is used.
        force_equal_length: every rank gets the same number of examples
            (neighbours may share some); else no example is repeated and the
            first ``n % size`` ranks get one more.

    Returns:
        tuple: ``(begin, end)``, the end exclusive.

    Raises:
        ValueError: on every rank, if ``n_total_samples`` on ``root`` is negative.
        TypeError: ``comm`` is not an mnpar communicator.
    """
    require_communicator(comm, "scatter_index")
    n = comm.bcast_obj(n_total_samples if comm.rank == root else None, root=root)
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n_total_samples={n!r} on rank {root} must be a non-negative int")
    return list(_ranges(int(n), comm.size, force_equal_length))[comm.rank]


def _take(dataset: Any, indices: np.ndarray) -> Any:
    """The examples at ``indices``, as compact as the dataset allows."""
    if isinstance(dataset, np.ndarray):
        return dataset[indices]
    if isinstance(dataset, chainer.datasets.TupleDataset):
        parts = dataset._datasets
        if all(isinstance(d, np.ndarray) for d in parts):
            return chainer.datasets.TupleDataset(*(d[indices] for d in parts))
    return [dataset[int(i)] for i in indices]


def _chunks(blob: bytes, k: int, max_buf_len: int) -> np.ndarray:
    return np.frombuffer(blob[k * max_buf_len: (k + 1) * max_buf_len], np.uint8)


def scatter_dataset(dataset: Any, comm: Any, root: int = 0, shuffle: bool = False,
                    seed: Optional[int] = None, max_buf_len: int = DEFAULT_MAX_BUF_LEN, *,
                    force_equal_length: bool = True) -> Any:
    """Scatters ``root``'s dataset: every rank receives its part; collective.

    Args:
        dataset: on ``root``, a dataset (a list, an array, a
            ``TupleDataset``, anything with ``len`` and indexing); ignored
            elsewhere.
        comm: an mnpar communicator.
        root: the rank that holds the dataset.
        shuffle: permute the examples before splitting them.
        seed: the permutation's seed; the same seed puts every example on
            the same rank every time. None draws a fresh permutation.
        max_buf_len: the largest chunk, in bytes, sent in one message.
        force_equal_length: as in :func:`scatter_index`. Keep it True for
            training: the multi-node optimizer and evaluator need every rank
            to run the same number of iterations.

    Returns:
        This rank's examples: an array for an array dataset, a
        ``TupleDataset`` for a ``TupleDataset`` of arrays, else a list. With
        ``force_equal_length=False`` and fewer examples than ranks, some
        ranks receive an empty one.

    Raises:
        ValueError: on every rank, if ``root`` has no dataset (None, or an
            object without a length and items), or
            ``max_buf_len`` is not positive.
        TypeError: ``comm`` is not an mnpar communicator.

    Example::

        train = mnpar.scatter_dataset(train if comm.rank == 0 else None, comm,
                                      shuffle=True, seed=0)
    """
    require_communicator(comm, "scatter_dataset")
    if not 0 < max_buf_len:
        raise ValueError(f"max_buf_len={max_buf_len} must be a positive number of bytes")
    blobs: List[bytes] = []
    error = None
    if comm.rank == root:
        if dataset is None:
            error = f"scatter_dataset: the dataset on root rank {root} is None"
        elif not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            error = (f"scatter_dataset: the dataset on root rank {root} has no length and "
                     f"items (got {type(dataset).__name__}); pass a list, an array or a "
                     "chainer dataset")
        else:
            n = len(dataset)
            order = (np.random.RandomState(seed).permutation(n) if shuffle
                     else np.arange(n))
            blobs = [pickle.dumps(_take(dataset, order[b:e]), pickle.HIGHEST_PROTOCOL)
                     for b, e in _ranges(n, comm.size, force_equal_length)]
    rounds = max((-(-len(b) // max_buf_len) for b in blobs), default=0)
    error, rounds = comm.bcast_obj((error, rounds), root=root)
    if error is not None:
        raise ValueError(error)
    received = []
    for k in range(rounds):
        parts = [_chunks(b, k, max_buf_len) for b in blobs] if comm.rank == root else None
        received.append(np.asarray(comm.scatter(parts, root=root)).tobytes())
    return pickle.loads(b"".join(received))
