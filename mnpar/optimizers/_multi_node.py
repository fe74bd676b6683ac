"""The multi-node optimizer: ChainerMN's wrapper around a Chainer optimizer.

Every update averages the gradients over the communicator with its own
strategy (``multi_node_mean_grad``), then lets the wrapped optimizer update.
Whenever the set of initialized parameters changes (the first update, or a
link initialized lazily in forward), rank 0's parameters are broadcast first:

=========================  ==================================================
first update, and ...      then
=========================  ==================================================
every rank already held    the gradients are valid: averaged and applied, so
rank 0's parameters        one update equals one single-process update on
                           the concatenated batch
some rank did not          its gradients belong to other parameters: this
                           update only broadcasts (as ChainerMN always does)
=========================  ==================================================

The wrapper forwards every other attribute to the wrapped optimizer, so a
``StandardUpdater``, snapshots and hooks see the optimizer they know.
"""
from typing import Any, Callable, List, Optional, Tuple

import chainer
import numpy as np

from .._arrays import is_cupy_array
from ..communicators._facade import Communicator, grads_to_reduce, note_progress

Layout = List[Tuple[str, bool]]


def params_to_reduce(target: chainer.Link, zero_fill: bool) -> List[Any]:
    """The parameters whose gradients are averaged, sorted by name (see
    ``grads_to_reduce``: with ``zero_fill`` every rank must agree on the set)."""
    return grads_to_reduce(target.namedparams(), zero_fill)


def layout_of(target: chainer.Link) -> Layout:
    return [(name, p.data is not None)
            for name, p in sorted(target.namedparams(), key=lambda item: item[0])]


def _host_copy(a: Any) -> np.ndarray:
    return a.get() if is_cupy_array(a) else np.array(a, copy=True)


class MultiNodeOptimizer:
    """Wraps ``actual_optimizer``: gradients averaged over ``communicator``.

    Create one with :func:`create_multi_node_optimizer`. Attributes other than
    the wrapper's own are read from and written to the wrapped optimizer.
    """

    _own: Tuple[str, ...] = ("communicator", "actual_optimizer", "zero_fill", "_layout")

    def __init__(self, actual_optimizer: chainer.Optimizer, communicator: Communicator,
                 zero_fill: bool) -> None:
        object.__setattr__(self, "communicator", communicator)
        object.__setattr__(self, "actual_optimizer", actual_optimizer)
        object.__setattr__(self, "zero_fill", zero_fill)
        object.__setattr__(self, "_layout", None)

    def setup(self, link: chainer.Link) -> "MultiNodeOptimizer":
        """Sets up the wrapped optimizer on ``link``; returns this wrapper."""
        self.actual_optimizer.setup(link)
        return self

    def update(self, lossfun: Optional[Callable[..., Any]] = None, *args: Any,
               **kwds: Any) -> None:
        """Computes gradients (if ``lossfun`` is given), averages them, updates.

        Collective over the communicator: every rank calls it once per step.
        """
        target = self.target
        if lossfun is not None:
            loss = lossfun(*args, **kwds)
            if getattr(self.actual_optimizer, "_use_cleargrads", True):
                target.cleargrads()
            else:
                target.zerograds()
            loss.backward(loss_scale=self.actual_optimizer._loss_scale)
            del loss
        note_progress("update {} of its multi-node optimizer", self.actual_optimizer.t + 1)
        if self._layout_changed(target) and not self._broadcast(target):
            return
        self._average_and_update(target)

    def _average_and_update(self, target: chainer.Link) -> None:
        self.communicator.multi_node_mean_grad(target, self.zero_fill)
        self.actual_optimizer.update(None)

    def _layout_changed(self, target: chainer.Link) -> bool:
        layout = layout_of(target)
        changed = layout != self._layout
        object.__setattr__(self, "_layout", layout)
        return changed

    def _broadcast(self, target: chainer.Link) -> bool:
        """Broadcasts rank 0's parameters; True if no rank's parameters changed."""
        before = [_host_copy(p.data) for _, p in sorted(target.namedparams())
                  if p.data is not None]
        self.communicator.bcast_data(target)
        after = [p.data for _, p in sorted(target.namedparams()) if p.data is not None]
        changed = any(not np.array_equal(b, _host_copy(a)) for b, a in zip(before, after))
        return not any(self.communicator.allgather_obj(changed))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.actual_optimizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._own:
            object.__setattr__(self, name, value)
        else:
            setattr(self.actual_optimizer, name, value)
