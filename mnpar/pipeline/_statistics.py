"""What one step of one rank gives back: its loss, and what it was asked to record.

``Executor.run`` returns a ``Statistics`` value; nothing is switched on the
executor from outside. Recording costs: a trace (``trace=True``) two clock
reads per action and per receive that waited; measuring memory
(``measure=True``) walks the graph of every live segment after every
action, which a step's timing shows, so both are asked for per step::

    stats = runner.step(batch, converter, device, measure=True)
    stats.peak_segments, stats.peak_bytes     # at most plan().peak_activations
"""
from typing import Iterable, List, NamedTuple, Tuple

from ._segment import Segment

WAIT_EVENT = 50e-6  # a receive that waited longer shows as its own event


class Event(NamedTuple):
    """One action as it ran, or a wait for a message (``wait F3.c0 <- rank 1``):
    its label and its start and end (``time.perf_counter``)."""

    label: str
    start: float
    end: float


class Statistics(NamedTuple):
    """One step of one rank: its loss, and what ``trace`` and ``measure`` recorded.

    Example::

        updater = PipelineUpdater(it, optimizer, comm, 8, measure=True)
        updater.update()
        updater.statistics.peak_segments   # <= updater.runner.plan(8).peak_activations[rank]
    """

    #: the mini-batch's loss on the rank that computes it (else 0)
    loss: float
    #: likewise, where the Classifier computes accuracy
    accuracy: float
    #: with ``trace``: every action and every wait for a message, in order
    events: Tuple[Event, ...] = ()
    #: with ``measure``: the most segments alive at once
    peak_segments: int = 0
    #: with ``measure``: the most bytes they held at once
    peak_bytes: int = 0
    #: with ``measure``: the most one segment held
    segment_bytes: int = 0


class Meter:
    """Collects a step's statistics as it runs, as much as it was asked for."""

    def __init__(self, trace: bool, measure: bool) -> None:
        self.trace = trace
        self.measure = measure
        self._events: List[Event] = []
        self._peak_segments = self._peak_bytes = self._segment_bytes = 0

    def action(self, label: str, start: float, end: float) -> None:
        if self.trace:
            self._events.append(Event(label, start, end))

    def wait(self, label: str, start: float, end: float) -> None:
        if self.trace and end - start > WAIT_EVENT:
            self._events.append(Event(label, start, end))

    def segments(self, live: Iterable[Segment]) -> None:
        """The live segments after an action: their count and bytes, and the peaks."""
        if not self.measure:
            return
        sizes = [seg.nbytes() for seg in live]
        self._peak_segments = max(self._peak_segments, len(sizes))
        self._peak_bytes = max(self._peak_bytes, sum(sizes))
        self._segment_bytes = max([self._segment_bytes] + sizes)

    def result(self, loss: float, accuracy: float) -> Statistics:
        return Statistics(loss, accuracy, tuple(self._events), self._peak_segments,
                          self._peak_bytes, self._segment_bytes)
