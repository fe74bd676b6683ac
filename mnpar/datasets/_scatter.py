"""Scattering a dataset from one rank: ChainerMN's result, with less traffic where it can.

ChainerMN broadcasts the whole dataset and returns, on every rank, a
``chainer.datasets.SubDataset`` view of its range; ``d[i]`` is an example and
``d[1:3]`` or ``d[:]`` a list of examples, whatever the dataset is. mnpar
returns the same ``SubDataset`` with the same examples, and moves less where
that cannot change them::

    dataset on root                        sent to each rank           its result
    ndarray, list, tuple, TupleDataset or  only its own examples,      SubDataset over
    DictDataset of those                   cut in order                 those examples
    anything else                          the whole object and the     SubDataset(dataset,
                                           permutation (as ChainerMN)   b, e, order)

Any other dataset may build its examples when they are read (image files,
random augmentation), so copying its examples once on root would freeze or
load them all; it travels whole and is read lazily on every rank, as in
ChainerMN. Either way the bytes are pickled once and moved in chunks of at most
``max_buf_len`` (one collective per chunk), and an error on root (no dataset,
not picklable) is raised on every rank.

How ``n`` examples are split over ``size`` ranks (ChainerMN's rule)::

    force_equal_length=True   every rank gets ceil(n / size) examples, starting
                              at n * rank // size (neighbours may overlap)
    force_equal_length=False  the first n % size ranks get one more; no overlap
"""
import pickle
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np
from chainer.datasets import DictDataset, SubDataset, TupleDataset

from ..communicators._facade import Communicator, require_communicator

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


def scatter_index(n_total_samples: int, comm: Communicator, root: int = 0, *,
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


def _cuttable(dataset: Any) -> bool:
    """Whether cutting ``dataset`` keeps every ``dataset[i]`` as it is."""
    if isinstance(dataset, np.ndarray) or type(dataset) in (list, tuple):
        return True
    if type(dataset) is TupleDataset:
        return all(_cuttable(d) for d in dataset._datasets)
    if type(dataset) is DictDataset:
        return all(_cuttable(d) for d in dataset._datasets.values())
    return False


def _cut(dataset: Any, indices: np.ndarray) -> Any:
    """The examples at ``indices``, in a dataset of the same kind (see ``_cuttable``)."""
    if isinstance(dataset, np.ndarray):
        return dataset[indices]
    if type(dataset) is TupleDataset:
        return TupleDataset(*(_cut(d, indices) for d in dataset._datasets))
    if type(dataset) is DictDataset:
        return DictDataset(**{k: _cut(d, indices) for k, d in dataset._datasets.items()})
    return [dataset[int(i)] for i in indices]


def _chunks(blob: bytes, k: int, max_buf_len: int) -> np.ndarray:
    return np.frombuffer(blob[k * max_buf_len: (k + 1) * max_buf_len], np.uint8)


def _rounds(blobs: List[bytes], max_buf_len: int) -> int:
    return max((-(-len(b) // max_buf_len) for b in blobs), default=0)


def _pack(dataset: Any, root: int, size: int, shuffle: bool, seed: Optional[int],
          force_equal_length: bool) -> Tuple[bool, List[bytes], Optional[np.ndarray]]:
    """On root: whether the dataset is cut, the pickled parts (or the whole), the order."""
    n = len(dataset)
    order = np.random.RandomState(seed).permutation(n) if shuffle else None
    try:
        if not _cuttable(dataset):
            return False, [pickle.dumps((dataset, order), pickle.HIGHEST_PROTOCOL)], order
        indices = np.arange(n) if order is None else order
        return True, [pickle.dumps(_cut(dataset, indices[b:e]), pickle.HIGHEST_PROTOCOL)
                      for b, e in _ranges(n, size, force_equal_length)], order
    except Exception as e:
        raise TypeError(f"scatter_dataset: the dataset on root rank {root} "
                        f"({type(dataset).__name__}) cannot be pickled ({type(e).__name__}: "
                        f"{e}); define its functions at module level, lambdas and "
                        "local functions cannot be pickled") from None


def _move(comm: Communicator, root: int, cut: bool, blobs: List[bytes], rounds: int,
          max_buf_len: int) -> bytes:
    """This rank's blob: its part if ``cut`` (scatter), else the whole (bcast; root keeps none)."""
    received = []
    for k in range(rounds):
        if cut:
            chunk = comm.scatter([_chunks(b, k, max_buf_len) for b in blobs]
                                 if comm.rank == root else None, root=root)
        else:
            chunk = comm.bcast(_chunks(blobs[0], k, max_buf_len) if comm.rank == root
                               else None, root=root)
        if cut or comm.rank != root:
            received.append(np.asarray(chunk).tobytes())
    return b"".join(received)


def _check(dataset: Any, root: int) -> None:
    if dataset is None:
        raise ValueError(f"scatter_dataset: the dataset on root rank {root} is None")
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ValueError(f"scatter_dataset: the dataset on root rank {root} has no length "
                         f"and items (got {type(dataset).__name__}); pass a list, an array "
                         "or a chainer dataset")


def scatter_dataset(dataset: Any, comm: Communicator, root: int = 0, shuffle: bool = False,
                    seed: Optional[int] = None, max_buf_len: int = DEFAULT_MAX_BUF_LEN, *,
                    force_equal_length: bool = True) -> SubDataset:
    """Scatters ``root``'s dataset: every rank gets a view of its part; collective.

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
        chainer.datasets.SubDataset: this rank's examples, as ChainerMN
        returns them: ``d[i]`` is an example, a slice is a list of examples.
        With ``force_equal_length=False`` and fewer examples than ranks,
        some ranks get an empty one.

    Raises:
        ValueError: on every rank, if ``root`` has no dataset (None, or an
            object without a length and items), or
            ``max_buf_len`` is not positive.
        TypeError: on every rank, if ``root``'s dataset cannot be pickled;
            ``comm`` is not an mnpar communicator.

    Example::

        train = mnpar.scatter_dataset(train if comm.rank == 0 else None, comm,
                                      shuffle=True, seed=0)
        shards = comm.allgather_obj(train[:])   # lists of examples, as in ChainerMN
    """
    require_communicator(comm, "scatter_dataset")
    if not 0 < max_buf_len:
        raise ValueError(f"max_buf_len={max_buf_len} must be a positive number of bytes")
    cut, order, error = False, None, None
    blobs: List[bytes] = []
    if comm.rank == root:
        try:
            _check(dataset, root)
            cut, blobs, order = _pack(dataset, root, comm.size, shuffle, seed,
                                      force_equal_length)
        except (ValueError, TypeError) as e:
            error = e
    error, cut, rounds = comm.bcast_obj((error, cut, _rounds(blobs, max_buf_len)), root=root)
    if error is not None:
        raise error
    blob = _move(comm, root, cut, blobs, rounds, max_buf_len)
    if cut:
        part = pickle.loads(blob)
        return SubDataset(part, 0, len(part))
    if comm.rank != root:
        dataset, order = pickle.loads(blob)
    begin, end = list(_ranges(len(dataset), comm.size, force_equal_length))[comm.rank]
    return SubDataset(dataset, begin, end, order)
