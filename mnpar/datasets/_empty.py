"""Empty datasets for ranks whose model takes no input.

A rank that receives its input from another rank still iterates over a
dataset, so that its iterator, updater and evaluator keep in step with the
others; every example is an empty tuple, which chainer's converters turn
into no arguments at all: the model is called as ``model()``.
"""
from typing import Any, Tuple

from chainer.dataset import DatasetMixin


class EmptyDataset(DatasetMixin):
    """``length`` examples, each an empty tuple; no memory per example."""

    def __init__(self, length: int) -> None:
        self._length = length

    def __len__(self) -> int:
        return self._length

    def get_example(self, i: int) -> Tuple[()]:
        if not -self._length <= i < self._length:
            raise IndexError(f"index {i} is out of range for an empty dataset of length "
                             f"{self._length}")
        return ()


def create_empty_dataset(dataset: Any) -> EmptyDataset:
    """A dataset as long as ``dataset`` whose examples are all empty tuples.

    Args:
        dataset: any dataset with ``len()``.

    Returns:
        EmptyDataset: ``len(dataset)`` examples, each ``()``.

    Raises:
        TypeError: ``dataset`` has no length.

    Example::

        train, test = chainer.datasets.get_mnist()
        if comm.rank == 1:
            train = mnpar.datasets.create_empty_dataset(train)
    """
    try:
        length = len(dataset)
    except TypeError:
        raise TypeError(f"create_empty_dataset needs a dataset with a length, not "
                        f"{type(dataset).__name__}") from None
    return EmptyDataset(length)
