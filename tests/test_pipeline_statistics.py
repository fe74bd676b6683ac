"""A step's statistics hold what was asked for and nothing else."""
import numpy as np

from mnpar.pipeline._segment import Segment, leaf
from mnpar.pipeline._statistics import WAIT_EVENT, Event, Meter, Statistics


def _segment(rows):
    seg = Segment()
    seg.inputs = [[leaf(np.ones((rows, 2), np.float32))]]
    return seg


def test_a_trace_keeps_actions_and_the_waits_that_took_time():
    meter = Meter(trace=True, measure=False)
    meter.action("F0", 1.0, 2.0)
    meter.wait("wait B0 <- rank 1", 2.0, 2.0 + WAIT_EVENT / 2)  # too short to show
    meter.wait("wait B0 <- rank 1", 2.0, 2.5)
    meter.segments([_segment(3)])  # not measured
    stats = meter.result(0.5, 0.25)
    assert stats == Statistics(0.5, 0.25, (Event("F0", 1.0, 2.0),
                                           Event("wait B0 <- rank 1", 2.0, 2.5)))


def test_measuring_keeps_the_peaks_of_live_segments():
    meter = Meter(trace=False, measure=True)
    meter.action("F0", 0.0, 1.0)
    meter.segments([_segment(3)])
    meter.segments([_segment(3), _segment(5)])
    meter.segments([])
    stats = meter.result(0.0, 0.0)
    assert stats.events == ()
    assert (stats.peak_segments, stats.peak_bytes, stats.segment_bytes) == (2, 64, 40)
