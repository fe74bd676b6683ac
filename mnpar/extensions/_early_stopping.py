"""Early stopping that every rank decides alike.

Chainer's ``EarlyStoppingTrigger`` compares a rank's own monitored value; on
several ranks their values differ, one rank would stop while the others
wait for it in the next collective. Here the value is first aggregated over
the ranks (an :class:`ObservationAggregator` at the check trigger: rank 0
averages every rank's values and broadcasts the mean), and each rank's
chainer trigger then compares that same broadcast number, so every rank
makes the same decision at the same iteration::

    check   rank 0 loss  rank 1 loss   aggregated   best   count (patience=2)
      1        0.50         0.70          0.60      0.60     0
      2        0.40         0.90          0.65      0.60     1
      3        0.45         0.85          0.65      0.60     2  -> every rank stops
"""
import numbers
from typing import Any, Optional

from chainer.training.triggers import EarlyStoppingTrigger

from ..communicators._facade import Communicator, require_communicator
from ._observation_aggregator import ObservationAggregator

MODES = ("auto", "min", "max")


class MultiNodeEarlyStoppingTrigger:
    """A stop trigger that fires on every rank once the mean over ranks stops improving.

    It works as chainer's ``EarlyStoppingTrigger``, except that at each
    check it compares the mean of ``monitor`` over all ranks (of the values
    reported since the last check), reported as ``monitor + suffix``. Use it
    as the trainer's stop trigger on every rank.

    Args:
        comm: the mnpar communicator.
        check_trigger: how often to compare, ``(n, 'epoch')`` or ``(n, 'iteration')``.
        monitor: the observation to watch.
        patience: how many checks in a row without improvement stop
            training; default 3 (``patients`` is an old alias).
        mode: ``'min'``, ``'max'``, or ``'auto'`` (``'max'`` if the
            monitor's name contains ``accuracy``, else ``'min'``).
        verbose: print the comparisons' direction and the stop.
        max_trigger: stop here at the latest.
        suffix: appended to ``monitor`` to name the aggregated value.

    Raises:
        TypeError: ``comm`` is not an mnpar communicator, ``monitor`` not a
            string, or ``patience`` not an int.
        ValueError: ``mode`` not one of ``'auto'``, ``'min'``, ``'max'``,
            or a negative ``patience``.

    Example::

        stop = mnpar.extensions.MultiNodeEarlyStoppingTrigger(
            comm, monitor="validation/main/loss", patience=3, max_trigger=(50, "epoch"))
        trainer = chainer.training.Trainer(updater, stop)
    """

    def __init__(self, comm: Communicator, *, check_trigger: Any = (1, "epoch"),
                 monitor: str = "main/loss", patience: Optional[int] = None,
                 mode: str = "auto", verbose: bool = False, max_trigger: Any = (100, "epoch"),
                 suffix: str = "_aggregated", **kwargs: Any) -> None:
        require_communicator(comm, "MultiNodeEarlyStoppingTrigger")
        if not isinstance(monitor, str) or not isinstance(suffix, str):
            raise TypeError(f"monitor={monitor!r} and suffix={suffix!r} must be strings")
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not one of {MODES}")
        for arg in ("patience", "patients"):
            value = patience if arg == "patience" else kwargs.get(arg)
            if value is None:
                continue
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise TypeError(f"{arg}={value!r} must be an int")
            if value < 0:
                raise ValueError(f"{arg}={value} must not be negative")
        aggregated = monitor + suffix
        self.aggregator = ObservationAggregator(comm, monitor, aggregated_key=aggregated,
                                                comm_trigger=check_trigger)
        self.actual_trigger = EarlyStoppingTrigger(
            check_trigger=check_trigger, monitor=aggregated, patience=patience, mode=mode,
            verbose=verbose, max_trigger=max_trigger, **kwargs)

    def __call__(self, trainer: Any) -> bool:
        """Whether to stop now: the same answer on every rank; collective at checks."""
        self.aggregator(trainer)
        return self.actual_trigger(trainer)

    def _stop_condition(self) -> bool:
        return self.actual_trigger._stop_condition()

    def _init_summary(self) -> None:
        self.actual_trigger._init_summary()

    def get_training_length(self) -> Any:
        """The length of ``max_trigger``, for progress bars."""
        return self.actual_trigger.get_training_length()
