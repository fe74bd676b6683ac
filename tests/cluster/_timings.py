"""What the Slurm failure tests measured, printed after the run (conftest.py).

Each row: the failure, the launcher (and its MPI), seconds from the failure to
the job's end, and the bound the test held it to. They are also written to
``build/cluster-timings.json`` for the docs' table.
"""
import json
import os
from typing import List, NamedTuple

from _hosts import ROOT

FILE = os.path.join(ROOT, "build", "cluster-timings.json")


class Timing(NamedTuple):
    case: str
    launcher: str
    seconds: float
    bound: float
    note: str = ""


MEASURED: List[Timing] = []


def record(case: str, launcher: str, seconds: float, bound: float, note: str = "") -> None:
    MEASURED.append(Timing(case, launcher, round(seconds, 2), bound, note))
    os.makedirs(os.path.dirname(FILE), exist_ok=True)
    with open(FILE, "w") as f:
        json.dump([t._asdict() for t in MEASURED], f, indent=1)


def table() -> List[str]:
    """The measurements as text lines, one per failure and launcher."""
    if not MEASURED:
        return []
    lines = [f"{'failure':<12} {'launcher':<22} {'ended after':>12}  bound"]
    for t in MEASURED:
        lines.append(f"{t.case:<12} {t.launcher:<22} {t.seconds:>10.1f} s  {t.bound:.0f} s"
                     + (f"  ({t.note})" if t.note else ""))
    return lines
