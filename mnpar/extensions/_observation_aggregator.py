"""One reported value, aggregated over the ranks at a trigger.

Every iteration each rank notes its own value of the observed key; when the
communication trigger fires the ranks' notes are gathered on rank 0, which
runs the aggregator once and broadcasts the result (or its error), so every
rank reports the same value and no rank waits for a root that failed::

    iteration  rank 0  rank 1      comm_trigger=(2, 'iteration')
        1       0.9     0.7        noted
        2       0.8     0.6        gathered: [[0.9, 0.8], [0.7, 0.6]] -> 0.75 on both

Values are converted to host arrays before they travel (a ``Variable`` to
its array, a GPU array to NumPy), so no rank unpickles another's device.
"""
from typing import Any, Callable, List, Optional

import chainer
import numpy as np
from chainer import Variable
from chainer.training import extension, util

from ..communicators._facade import Communicator, require_communicator


def to_host(value: Any) -> Any:
    """A reported value as a host scalar or array (``Variable`` and GPU arrays unwrapped)."""
    if isinstance(value, Variable):
        value = value.array
    if isinstance(value, chainer.get_array_types()) and not isinstance(value, np.ndarray):
        return chainer.backend.CpuDevice().send(value)  # cupy or chainerx, to NumPy
    return value


def average_2d(xs: List[List[Any]]) -> Any:
    """The mean of every value of every rank; None when no rank observed any."""
    values = [v for per_rank in xs for v in per_rank]
    return sum(values) / len(values) if values else None


class ObservationAggregator(extension.Extension):
    """Aggregates ``original_key`` over the ranks into ``aggregated_key``.

    Each iteration this rank's value of ``original_key`` (if reported) is
    kept. When ``comm_trigger`` fires, every rank's kept values are gathered
    and ``aggregator`` (default: the mean of all of them) computes one value
    on rank 0, which every rank then finds in ``trainer.observation``.
    Collective when ``comm_trigger`` fires: add it on every rank alike.

    Args:
        comm: the mnpar communicator.
        original_key: the observation to aggregate, e.g. ``'main/loss'``.
        aggregated_key: where to report the result; default ``original_key``
            (overwritten).
        comm_trigger: when to communicate, e.g. ``(1, 'epoch')``.
        aggregator: a function of a list (one per rank) of lists of the
            values observed since the last communication; default the mean.
            It runs on rank 0 only; returning None reports nothing.

    Raises:
        TypeError: ``comm`` is not an mnpar communicator, ``original_key``
            not a string, or ``aggregator`` not callable.

    Example::

        trainer.extend(mnpar.extensions.ObservationAggregator(
            comm, "main/loss", "main/loss_all", comm_trigger=(1, "epoch")))
    """

    trigger = 1, "iteration"
    priority = extension.PRIORITY_EDITOR
    name = None

    def __init__(self, comm: Communicator, original_key: str,
                 aggregated_key: Optional[str] = None, *,
                 comm_trigger: Any = (1, "iteration"),
                 aggregator: Optional[Callable[[List[List[Any]]], Any]] = None) -> None:
        require_communicator(comm, "ObservationAggregator")
        if not isinstance(original_key, str):
            raise TypeError(f"original_key={original_key!r} must be an observation's name")
        if aggregated_key is not None and not isinstance(aggregated_key, str):
            raise TypeError(f"aggregated_key={aggregated_key!r} must be a string or None")
        if aggregator is not None and not callable(aggregator):
            raise TypeError(f"aggregator={aggregator!r} must be a function of a list of lists")
        self.comm = comm
        self.original_key = original_key
        self.aggregated_key = original_key if aggregated_key is None else aggregated_key
        self.comm_trigger = util.get_trigger(comm_trigger)
        self.observation_history: List[Any] = []
        self.aggregator = aggregator or average_2d

    def compute_summary(self, trainer: Any) -> Any:
        """Notes this iteration's value; at the trigger, the aggregate (else None)."""
        if self.original_key in trainer.observation:
            self.observation_history.append(to_host(trainer.observation[self.original_key]))
        if not self.comm_trigger(trainer):
            return None
        gathered = self.comm.gather_obj(self.observation_history)
        self.observation_history = []
        outcome = None
        if gathered is not None:  # rank 0
            try:
                outcome = (True, self.aggregator(gathered))
            except Exception as e:
                outcome = (False, f"{type(e).__name__}: {e}")
                self.comm.bcast_obj(outcome)
                raise
        ok, value = self.comm.bcast_obj(outcome)
        if not ok:
            raise RuntimeError(f"ObservationAggregator({self.original_key!r}): the aggregator "
                               f"failed on rank 0: {value}")
        return value

    def __call__(self, trainer: Any) -> None:
        summary = self.compute_summary(trainer)
        if summary is not None:
            trainer.observation[self.aggregated_key] = summary
