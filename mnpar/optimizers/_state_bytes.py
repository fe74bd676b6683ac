"""How many bytes of model state a rank holds, counted array by array.

The model state is what training keeps between updates: parameters,
gradients and the optimizer's state (chainer's update rules' ``state``
arrays and float32 master copies). Each array is counted by the memory it
lives in: a view (a parameter in a flat buffer, a gradient in a reduction
buffer, a shard of either) counts its whole base buffer once, in the first
category that reaches it, so buffers that views share are never counted
twice and a buffer kept whole for views of a part is counted whole::

    float32 Adam, bytes a parameter     parameters  gradients  optimizer state
    plain data parallelism (stage 0)    4           4          8
    stage 1                             4           4          8 / N
    stage 2                             4           4 / N      8 / N
    stage 3                             4 / N       4 / N      8 / N

Memory that the ranks of a node share (the ``hierarchical`` strategy sums
gradients in one shared-memory window holding a row per rank, which every
rank maps whole) counts this rank's share of it: its size over the ranks
that share it.

``formula`` gives that table; ``tests/test_optimizers_sharded_memory.py``
holds every stage within 5% of it, and ``benchmarks/bench_sharded.py``
reports it beside the process's peak resident memory.
"""
from typing import Any, Dict, Iterable, NamedTuple, Optional, Set

import chainer
import numpy as np

from .._arrays import is_cupy_array


class StateBytes(NamedTuple):
    """Bytes of model state this rank holds (see the module docstring)."""

    parameters: int
    gradients: int
    optimizer_state: int
    gathered: int = 0  # stage 3: whole parameters of links gathered right now
    peak_gathered: int = 0  # stage 3: the most gathered at once since setup

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state


def formula(stage: int, size: int, n_params: int, itemsize: int = 4,
            state_arrays: int = 2) -> Dict[str, float]:
    """The bytes each category takes at ``stage`` on ``size`` ranks for ``n_params``
    parameters of ``itemsize`` bytes with ``state_arrays`` state arrays each (Adam: 2)."""
    whole = float(n_params * itemsize)
    return {"parameters": whole / size if stage >= 3 else whole,
            "gradients": whole / size if stage >= 2 else whole,
            "optimizer_state": state_arrays * whole / (size if stage >= 1 else 1)}


def _root(a: Any) -> Any:
    while getattr(a, "base", None) is not None and hasattr(a.base, "nbytes"):
        a = a.base
    return a


class _Counter:
    def __init__(self, sharing: int) -> None:
        self.seen: Set[int] = set()
        self.sharing = max(1, sharing)  # ranks that map a shared-memory window

    def count(self, arrays: Iterable[Optional[Any]]) -> int:
        total = 0
        for a in arrays:
            if a is None or not hasattr(a, "nbytes"):
                continue
            root = _root(a)
            if id(root) not in self.seen:
                self.seen.add(id(root))
                shared = not (isinstance(root, np.ndarray) or is_cupy_array(root))
                total += int(root.nbytes) // (self.sharing if shared else 1)
        return total


def _rules(optimizer: Any) -> Iterable[Any]:
    target = getattr(optimizer, "actual_optimizer", optimizer).target
    return [p.update_rule for p in target.params() if getattr(p, "update_rule", None)]


def state_bytes(optimizer: Any) -> StateBytes:
    """The bytes of parameters, gradients and optimizer state this rank holds for
    ``optimizer`` (a chainer optimizer, a multi-node or a sharded one) and its model.

    Example::

        used = mnpar.optimizers.state_bytes(optimizer)
        print(used.parameters, used.gradients, used.optimizer_state)
    """
    model = optimizer.target
    inner = getattr(optimizer, "actual_optimizer", optimizer)
    links = [model] + ([inner.target] if inner.target is not model else [])
    params = [p for link in links for p in link.params()]
    comm = getattr(optimizer, "communicator", None)
    counter = _Counter(getattr(comm, "intra_size", 1))
    n_params = counter.count(p.array for p in params)
    n_grads = counter.count(p.grad for p in params)
    state = []
    for rule in _rules(optimizer):
        state += list((rule.state or {}).values())
        fp32 = getattr(rule, "_fp32_param", None)
        if isinstance(fp32, chainer.Variable):
            state += [fp32.array, fp32.grad]
    n_state = counter.count(state)
    gather = getattr(optimizer, "_gather", None)
    return StateBytes(n_params, n_grads, n_state,
                      gather.gathered_bytes if gather is not None else 0,
                      gather.peak_gathered_bytes if gather is not None else 0)
