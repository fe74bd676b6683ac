"""One mini-batch as micro-batches: what the executor is given, and the loss it gives back.

The runner cuts a mini-batch along its first axis (sizes differ by at most
one) and hands the executor ``Microbatches``: per micro-batch its inputs,
labels and share of the mini-batch, ``size_k / batch``. The loss of
micro-batch k enters backward with its share as gradient, so the gradients
the parameters accumulate over the micro-batches are those of the mean over
the whole mini-batch; the reported loss and accuracy are the same weighted
sums (``Losses``), each micro-batch counted once even when recomputation
runs its forward twice.
"""
from typing import Any, Callable, NamedTuple, Optional, Sequence, Set, Tuple

import chainer

from ._segment import data_of


class Head(NamedTuple):
    """The loss on the rank that computes it: a ``chainer.links.Classifier``'s parts."""

    lossfun: Callable[..., Any]
    accfun: Optional[Callable[..., Any]]


class Microbatches(NamedTuple):
    """One mini-batch, cut.

    Attributes:
        inputs: per micro-batch, the model's input arrays (empty where none).
        labels: per micro-batch, the labels (only with a head).
        weights: per micro-batch, its share of the mini-batch.
        train: keep graphs and run backwards (else forwards only).
        recompute: whether micro-batch k's activations are recomputed.
        sizes: per micro-batch, its examples (the random functions' share).
    """

    inputs: Sequence[Tuple[Any, ...]]
    labels: Sequence[Any]
    weights: Sequence[float]
    train: bool
    recompute: Callable[[int], bool]
    sizes: Sequence[int] = ()

    @property
    def n(self) -> int:
        return len(self.weights)


class Losses:
    """The mini-batch's loss and accuracy: each micro-batch's, weighted by its share."""

    def __init__(self, batch: Microbatches) -> None:
        self.batch = batch
        self.loss = 0.0
        self.accuracy = 0.0
        self._counted: Set[int] = set()

    def add(self, k: int, loss: chainer.Variable, y: Any, head: Head) -> None:
        """Adds micro-batch k's loss and accuracy, weighted, once."""
        if k in self._counted:
            return
        self._counted.add(k)
        weight = self.batch.weights[k]
        self.loss += weight * float(data_of(loss))
        if head.accfun is not None:
            with chainer.no_backprop_mode():
                acc = head.accfun(y, self.batch.labels[k])
            self.accuracy += weight * float(data_of(acc))
