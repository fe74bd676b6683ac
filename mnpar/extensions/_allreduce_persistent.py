"""Persistent values (BatchNormalization's running statistics) averaged over ranks.

Each rank's BatchNormalization sees only its own shard, so its running mean
and variance differ from the other ranks'. Before evaluating or saving, this
extension replaces every floating-point persistent array with its mean over
the ranks. The arrays of one dtype travel as one buffer (one ``allreduce``
per dtype, not per array); integer persistents and Python numbers (such as
BatchNormalization's ``N``) are left alone, as in ChainerMN.

The ranks first compare the names, shapes and dtypes of what they average:
a model that differs across ranks is a ``ValueError`` on every rank, never
a sum of unrelated arrays.
"""
from typing import Any, Dict, List, Tuple

import chainer
import numpy as np
from chainer.training import extension

from .._arrays import cupy_module, device_of, is_cupy_array, to_host
from ..communicators._facade import Communicator, require_communicator


def float_persistents(model: chainer.Link) -> List[Tuple[str, Any]]:
    """``(name, array)`` of the model's floating-point persistent arrays, sorted by name."""
    found = []
    for link_name, link in model.namedlinks():
        for name in link._persistent:
            value = link.__dict__[name]
            dtype = getattr(value, "dtype", None)
            if getattr(value, "ndim", None) is not None and dtype is not None \
                    and np.dtype(dtype).kind == "f":
                found.append((f"{link_name}/{name}", value))
    return sorted(found, key=lambda item: item[0])


class AllreducePersistent(extension.Extension):
    """Averages the model's floating-point persistent arrays over the ranks.

    Mainly for BatchNormalization: the running mean and variance then
    reflect every rank's examples. It need not run often; by default once
    per epoch, before the evaluators and snapshots (its priority is above
    ``PRIORITY_WRITER``). Collective: add it on every rank.

    Args:
        model: the ``chainer.Link`` whose persistents to average; the same
            on every rank.
        comm: the mnpar communicator.

    Raises:
        TypeError: ``model`` is not a ``chainer.Link``, or ``comm`` not an
            mnpar communicator.
        ValueError: (when called, on every rank) the persistents differ across ranks.

    Example::

        trainer.extend(mnpar.extensions.AllreducePersistent(model, comm))
    """

    trigger = 1, "epoch"
    priority = extension.PRIORITY_WRITER + 1  # before the evaluators

    def __init__(self, model: chainer.Link, comm: Communicator) -> None:
        if not isinstance(model, chainer.Link):
            raise TypeError(f"AllreducePersistent needs a chainer.Link, not "
                            f"{type(model).__name__}")
        require_communicator(comm, "AllreducePersistent")
        self.model = model
        self.comm = comm

    def __call__(self, trainer: Any = None) -> None:
        persistents = float_persistents(self.model)
        layout = [(name, a.shape, str(a.dtype)) for name, a in persistents]
        _check_same(self.comm.allgather_obj(layout))
        groups: Dict[str, List[Any]] = {}
        for _, array in persistents:
            groups.setdefault(str(array.dtype), []).append(array)
        for dtype in sorted(groups):
            self._average(groups[dtype])

    def _average(self, arrays: List[Any]) -> None:
        host = [to_host(a) for a in arrays]
        flat = np.concatenate([h.ravel() for h in host])
        mean = self.comm.allreduce(flat) / self.comm.size
        offset = 0
        for a in arrays:
            part = mean[offset: offset + a.size].reshape(a.shape).astype(a.dtype, copy=False)
            offset += a.size
            if is_cupy_array(a):
                with device_of(a):
                    a[...] = cupy_module().asarray(part)
            else:
                a[...] = part


def _check_same(layouts: List[Any]) -> None:
    """Raises ValueError naming the first difference unless every rank has one layout."""
    first = dict((name, spec) for name, *spec in layouts[0])
    for rank, layout in enumerate(layouts[1:], start=1):
        other = dict((name, spec) for name, *spec in layout)
        if other == first:
            continue
        diffs = [f"{n!r}: rank 0 has {first.get(n, 'nothing')}, rank {rank} has "
                 f"{other.get(n, 'nothing')}" for n in sorted(set(first) | set(other))
                 if first.get(n) != other.get(n)]
        raise ValueError("AllreducePersistent: the persistent values differ across ranks; "
                         + "; ".join(diffs[:5]))
