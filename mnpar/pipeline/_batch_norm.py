"""Batch normalization whose running statistics move once per mini-batch.

A pipelined update cuts each mini-batch into K micro-batches, so chainer's
``BatchNormalization`` would move its running averages K times per update,
each time from a small batch. ``DeferredBatchNormalization`` is torchgpipe's
deferred batch norm: it normalizes each micro-batch by that micro-batch's
statistics, as before, but only adds the input to per-channel sums;
``commit`` moves the running averages once, from the sums, exactly as
chainer's link would have after one forward of the whole mini-batch. The
``Runner`` commits after every training step.

The sums are of the input less the first micro-batch's mean, in float64, so
the variance keeps its digits when the mean is large. The link keeps no
state of its own beyond its lazily set sums, so ``defer_batch_norm`` can
change a built model's links in place by their class alone.
"""
from typing import Any, Tuple

import chainer
import chainer.links as L
import numpy as np
from chainer.utils import argument


class DeferredBatchNormalization(L.BatchNormalization):
    """chainer's ``BatchNormalization`` whose running statistics wait for ``commit``.

    The constructor, parameters, persistent values and serialization are
    those of ``chainer.links.BatchNormalization`` (see it for the arguments),
    so a model can use it anywhere and load the other's snapshots.

    In training (``chainer.config.train``) a call normalizes its input by
    the input's own mean and variance and adds the input to per-channel sums
    instead of moving ``avg_mean`` and ``avg_var``; a call under
    ``chainer.config.in_recomputing`` (the second forward of activation
    recomputation) adds nothing. ``commit`` then moves them once, as one call
    of chainer's link on all those inputs together would have: the link's
    ``decay``, and the unbiased variance ``m / (m - 1) * var`` with ``m``
    counting every input value of a channel. With ``finetune=True`` the calls
    between two commits are one fine-tuning batch (``N`` grows by one at the
    commit). Outside training it is chainer's link: it normalizes by
    ``avg_mean`` and ``avg_var``.

    ``PipelineUpdater`` commits after every update. Elsewhere (a
    ``StandardUpdater``, a loop of your own) call ``commit_deferred(model)``
    after each training forward of a mini-batch: without a commit the
    running statistics never move.

    Example::

        class Block(chainer.Chain):
            def __init__(self):
                super().__init__()
                with self.init_scope():
                    self.conv = L.Convolution2D(None, 64, 3, pad=1)
                    self.bn = mnpar.pipeline.DeferredBatchNormalization(64)

            def forward(self, x):
                return F.relu(self.bn(self.conv(x)))
    """

    avg_mean: Any  # chainer's, set by __init__ or the first call
    avg_var: Any

    # Set by the first training call after a commit; class defaults, so that
    # a chainer link whose class is swapped needs nothing from __init__.
    _count = 0  # input values per channel since the last commit
    _finetune = False
    _shift: Any = None  # the first input's mean, kept dims
    _sum: Any = None  # per channel: sum of (x - shift)
    _sqsum: Any = None  # per channel: sum of (x - shift) ** 2

    def forward(self, x: Any, **kwargs: Any) -> Any:
        """forward(self, x, finetune=False)

        Normalizes ``x``; in training, by its own statistics, adding it to
        the sums ``commit`` uses.

        Raises:
            ValueError: ``finetune`` differs from that of the calls since the
                last commit.
        """
        finetune, = argument.parse_kwargs(
            kwargs, ("finetune", False),
            test="test argument is not supported anymore. Use chainer.using_config")
        if not chainer.config.train or chainer.config.in_recomputing:
            return super().forward(x, finetune=finetune)
        if self._count and finetune != self._finetune:
            raise ValueError(
                f"finetune={finetune} after calls with finetune={self._finetune} since the "
                "last commit; call commit() (mnpar.pipeline.commit_deferred) between "
                "training and fine-tuning")
        # chainer's training path without its running-average update, which it
        # skips under the recomputation flag (and keeps N as it was).
        with chainer.using_config("in_recomputing", True):
            y = super().forward(x, finetune=finetune)
        self._add(chainer.as_array(x), finetune)
        return y

    def _add(self, x: Any, finetune: bool) -> None:
        """Adds ``x`` to the per-channel sums."""
        axis = self._axis(x.ndim)
        x = x.astype(np.float64)
        if not self._count:
            self._shift = x.mean(axis=axis, keepdims=True)
            self._sum = self._sqsum = 0.0
            self._finetune = finetune
        d = x - self._shift
        self._sum = self._sum + d.sum(axis=axis)
        self._sqsum = self._sqsum + (d * d).sum(axis=axis)
        self._count += x.size // self.avg_mean.size

    def _axis(self, ndim: int) -> Tuple[int, ...]:
        """The axes the statistics run over, as chainer's function picks them."""
        if self.axis is not None:
            return tuple(self.axis)
        return (0,) + tuple(range(self.avg_mean.ndim + 1, ndim))

    def commit(self) -> None:
        """Moves ``avg_mean`` and ``avg_var`` once by the inputs since the last commit.

        Then forgets them. Without any input since the last commit it does
        nothing.
        """
        if not self._count:
            return
        m = self._count
        offset = self._sum / m
        mean = self._shift.reshape(self.avg_mean.shape) + offset
        var = self._sqsum / m - offset * offset
        adjust = m / max(m - 1.0, 1.0)  # unbiased, as chainer's
        if self._finetune:
            self.N += 1
            decay = 1.0 - 1.0 / self.N
        else:
            decay = self.decay
        dtype = self.avg_mean.dtype
        self.avg_mean *= decay
        self.avg_mean += ((1 - decay) * mean).astype(dtype, copy=False)
        self.avg_var *= decay
        self.avg_var += ((1 - decay) * adjust * var).astype(dtype, copy=False)
        self._clear()

    def _clear(self) -> None:
        self._count = 0
        self._shift = self._sum = self._sqsum = None


def commit_deferred(link: chainer.Link) -> None:
    """Calls ``commit`` on every ``DeferredBatchNormalization`` in ``link`` (itself included).

    Example::

        loss = model(x, t)  # in training, on the whole mini-batch
        mnpar.pipeline.commit_deferred(model)
    """
    for child in link.links():
        if isinstance(child, DeferredBatchNormalization):
            child.commit()


def defer_batch_norm(link: chainer.Link) -> int:
    """Turns every ``chainer.links.BatchNormalization`` in ``link`` into a deferred one, in place.

    Only links of exactly that class change, by their class alone: each keeps
    its parameters, running statistics, name and place in the model, and
    optimizers set up on the model go on working. Subclasses (and
    ``mnpar.links.MultiNodeBatchNormalization``, which is none) are left
    as they are. ``PipelineUpdater(..., deferred_batchnorm=True)`` calls it.

    Args:
        link: a model, or one link; itself included.

    Returns:
        How many links changed.
    """
    changed = 0
    for child in link.links():
        if type(child) is L.BatchNormalization:
            child.__class__ = DeferredBatchNormalization
            changed += 1
    return changed

