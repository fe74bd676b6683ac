"""Proposing a balance: profile each layer, then cut the costs evenly.

As torchgpipe's ``balance_by_time`` and ``balance_by_size``: each layer of a
``chainer.Sequential`` runs on a sample batch (forward and backward), its
cost is measured, and the layers are cut into contiguous parts whose
largest total is as small as it can be (an exact search over the cut).
Timings differ between ranks, so pass ``comm`` to use rank 0's proposal
everywhere.
"""
import time
from typing import Any, List, Optional, Sequence

import chainer
import numpy as np

from .._arrays import get_array_module, is_cupy_array, sync_device


def _profile(model: chainer.Sequential, sample: Any, repeat: int) -> List[tuple]:
    """Per layer: (seconds for forward and backward, bytes of parameters and output).

    ``sample`` may be a cupy array on the model's GPU; each timing then waits
    for the GPU's queued work.
    """
    costs = []
    array = sample if is_cupy_array(sample) else np.asarray(sample)
    for layer in model:
        x = chainer.Variable(array, requires_grad=array.dtype.kind == "f")
        sync_device(array)
        start = time.perf_counter()
        for _ in range(repeat):
            y = layer(x)
            if y.requires_grad:
                ones = get_array_module(y.array).ones_like(y.array)
                chainer.backward([y], [chainer.Variable(ones)])
        sync_device(y.array)
        seconds = (time.perf_counter() - start) / repeat
        params = sum(p.array.nbytes for p in getattr(layer, "params", lambda: [])()
                     if p.array is not None)
        array = y.array
        costs.append((seconds, params + array.nbytes))
    if isinstance(model, chainer.Link):
        model.cleargrads()
    return costs


def solve(costs: Sequence[float], partitions: int) -> List[int]:
    """Layers per part: contiguous parts minimising the largest total cost."""
    n = len(costs)
    if not 1 <= partitions <= n:
        raise ValueError(f"cannot cut {n} layers into {partitions} parts of at least one")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(partitions + 1)]
    cut = [[0] * (n + 1) for _ in range(partitions + 1)]
    best[0][0] = 0.0
    for p in range(1, partitions + 1):
        for j in range(p, n + 1):
            for i in range(p - 1, j):
                value = max(best[p - 1][i], prefix[j] - prefix[i])
                if value < best[p][j]:
                    best[p][j], cut[p][j] = value, i
    sizes, j = [], n
    for p in range(partitions, 0, -1):
        i = cut[p][j]
        sizes.append(j - i)
        j = i
    return sizes[::-1]


def _propose(model: chainer.Sequential, partitions: int, sample: Any, which: int,
             repeat: int, comm: Optional[Any]) -> List[int]:
    balance: Optional[List[int]] = None
    if comm is None or comm.rank == 0:
        balance = solve([c[which] for c in _profile(model, sample, repeat)], partitions)
    if comm is not None:
        balance = comm.bcast_obj(balance, root=0)
    assert balance is not None
    return balance


def balance_by_time(partitions: int, model: chainer.Sequential, sample: Any, repeat: int = 3,
                    comm: Optional[Any] = None) -> List[int]:
    """A balance that evens out each part's forward and backward time.

    Args:
        partitions: the number of parts (ranks).
        model: the whole model.
        sample: an input batch for the first layer.
        repeat: runs per layer, averaged.
        comm: if given, rank 0 profiles and every rank gets its answer (collective).

    Returns:
        Layers per part.

    Example::

        balance = balance_by_time(comm.size, model, x[:64], comm=comm)
    """
    return _propose(model, partitions, sample, 0, repeat, comm)


def balance_by_size(partitions: int, model: chainer.Sequential, sample: Any,
                    comm: Optional[Any] = None) -> List[int]:
    """A balance that evens out each part's memory: parameters plus activations.

    Args and returns as for ``balance_by_time``.
    """
    return _propose(model, partitions, sample, 1, 1, comm)
