"""The actions a step ran, as a Chrome trace (``chrome://tracing``, Perfetto).

Each rank records its own actions (``trace=True``), and each receive that
waited as its own event (``wait F3 <- rank 1``, category ``wait``); ``save_chrome_trace``
gathers them on rank 0 and writes one JSON file with a row per rank, times in
microseconds from the earliest start (clocks of one machine agree).
"""
import json
from typing import Any, Dict, List, Sequence

from ..communicators import Communicator
from ._statistics import Event

_CATEGORIES = {"F": "forward", "B": "backward", "W": "weight gradients"}


def chrome_events(events_by_rank: Sequence[Sequence[Event]]) -> List[Dict[str, Any]]:
    """Complete ('X') events, one row (``pid``) per rank."""
    starts = [e.start for events in events_by_rank for e in events]
    origin = min(starts) if starts else 0.0
    return [{"name": e.label, "cat": _CATEGORIES.get(e.label[0], "wait"),
             "ph": "X", "pid": rank, "tid": 0, "ts": (e.start - origin) * 1e6,
             "dur": (e.end - e.start) * 1e6}
            for rank, events in enumerate(events_by_rank) for e in events]


def save_chrome_trace(comm: Communicator, events: Sequence[Event], path: str) -> None:
    """Writes every rank's ``events`` to ``path`` on rank 0; collective."""
    gathered = comm.gather_obj([tuple(e) for e in events], root=0)
    if gathered is not None:  # rank 0
        by_rank = [[Event(*e) for e in events] for events in gathered]
        with open(path, "w") as f:
            json.dump({"traceEvents": chrome_events(by_rank), "displayTimeUnit": "ms"}, f)
