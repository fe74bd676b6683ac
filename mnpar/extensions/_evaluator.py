"""The multi-node evaluator: every rank evaluates its shard, the results are averaged.

ChainerMN patches the evaluator's ``evaluate`` so that each reported value
is averaged over the ranks with one ``allreduce_obj`` per value. Here one
``allgather_obj`` carries every rank's whole result with the size of the
shard it evaluated, and each value is averaged weighted by that size:

=======================  =================================================
shards                   result
=======================  =================================================
equal (the default of    the plain mean over ranks, as ChainerMN
``scatter_dataset``)
unequal                  each rank counts by its number of examples
empty on some rank       that rank evaluates nothing and is left out
=======================  =================================================
"""
from typing import Any, Dict, List, Tuple

import numpy as np

from .._arrays import is_cupy_array
from ..communicators._facade import Communicator, require_communicator


def _shard_size(evaluator: Any) -> int:
    """The number of examples the evaluator's main iterator walks (1 if unknown)."""
    try:
        return len(evaluator.get_iterator("main").dataset)
    except (AttributeError, KeyError, TypeError):
        return 1


def _as_float(value: Any) -> float:
    if hasattr(value, "array"):  # a chainer.Variable
        value = value.array
    if is_cupy_array(value):
        value = value.get()
    return float(np.asarray(value))


def _weighted_means(results: List[Tuple[int, Dict[str, float]]]) -> Dict[str, float]:
    keys = sorted({k for _, values in results for k in values})
    out = {}
    for k in keys:
        pairs = [(w, values[k]) for w, values in results if k in values]
        total = sum(w for w, _ in pairs)
        out[k] = (sum(w * v for w, v in pairs) / total if total > 0
                  else sum(v for _, v in pairs) / len(pairs))
    return out


def create_multi_node_evaluator(actual_evaluator: Any, communicator: Communicator) -> Any:
    """Makes an evaluator average its results over ``communicator``'s ranks.

    Each rank evaluates its own shard (e.g. from :func:`mnpar.scatter_dataset`);
    ``evaluate()`` then returns, on every rank, each reported value averaged
    over the ranks, weighted by the size of their shards. A rank whose shard is
    empty skips the evaluation and counts for nothing. ``evaluate`` is
    collective: every rank must call it (the trainer does, at the same trigger).

    Args:
        actual_evaluator: a ``chainer.training.extensions.Evaluator`` (or any
            extension with an ``evaluate()`` returning a dict of scalars).
        communicator: an mnpar communicator.

    Returns:
        ``actual_evaluator`` itself, patched.

    Raises:
        TypeError: the evaluator has no ``evaluate`` method, or
            ``communicator`` is not an mnpar communicator.

    Example::

        evaluator = chainer.training.extensions.Evaluator(test_iter, model)
        trainer.extend(mnpar.create_multi_node_evaluator(evaluator, comm))
    """
    require_communicator(communicator, "create_multi_node_evaluator")
    original = getattr(actual_evaluator, "evaluate", None)
    if not callable(original):
        raise TypeError(f"{type(actual_evaluator).__name__} has no evaluate() method to "
                        "make multi-node")

    def evaluate() -> Dict[str, float]:
        size = _shard_size(actual_evaluator)
        local = original() if size > 0 else {}
        mine = {k: _as_float(v) for k, v in local.items()}
        return _weighted_means(communicator.allgather_obj((size, mine)))

    actual_evaluator.evaluate = evaluate
    actual_evaluator._mn_original_evaluate = original
    actual_evaluator._mn_communicator = communicator
    return actual_evaluator
