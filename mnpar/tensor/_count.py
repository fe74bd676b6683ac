"""Counting the messages of a split model, layer by layer.

``collectives()`` observes every collective of ``mnpar.functions``' conjugate
functions and of the vocabulary-parallel loss while it is active, and counts
them by the layer that made them (its path in the parallelized model), the
operation and the pass::

    with mnpar.tensor.collectives() as counts:
        loss = model(x, t)
        loss.backward()
    counts[("/predictor/blocks/0/attention/out", "allreduce", "forward")]   # 1

A node's backward is counted for the layer that made it in forward.
"""
import collections
import contextlib
from typing import Any, Counter, Iterator, Tuple

from ..functions import _conjugate
from ._guard import path

Key = Tuple[str, str, str]  # (layer, operation, 'forward' or 'backward')


@contextlib.contextmanager
def collectives() -> Iterator[Counter[Key]]:
    """Counts the tensor group's collectives by (layer, operation, pass) while active.

    Yields:
        a ``collections.Counter`` filled as the model runs.
    """
    counts: Counter[Key] = collections.Counter()

    def observe(node: Any, op: str, phase: str) -> None:
        if phase == "forward" and not hasattr(node, "_mnpar_layer"):
            try:
                node._mnpar_layer = path()
            except AttributeError:  # a function, not a node
                pass
        if op:
            counts[(getattr(node, "_mnpar_layer", path()), op, phase)] += 1

    _conjugate.observers.append(observe)
    try:
        yield counts
    finally:
        _conjugate.observers.remove(observe)
