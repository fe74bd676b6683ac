"""Sends in flight that outlive their transport: completed before MPI finalizes.

A standard-mode send returns before MPI has moved the message. A transport
garbage-collected without ``finalize()`` (ChainerMN code never calls it)
hands its sends in flight here: their requests and buffers must live until
MPI is done with them, or the peer receives freed memory; and a process that
exits right after its last sends must not lose them, or its peer waits for
data that never comes.
"""
import atexit
import sys
import time
from typing import Any, List, Tuple

from mpi4py import MPI

EXIT_SECONDS = 30.0  # the longest the interpreter's exit waits for sends in flight

_orphans: List[Tuple[MPI.Request, Any]] = []


def adopt(pending: List[Tuple[MPI.Request, Any]]) -> None:
    """Keeps a dropped transport's ``(request, buffer)`` pairs until they complete."""
    _orphans.extend(pending)


def reap() -> None:
    """Forgets the orphans MPI has completed."""
    if _orphans:
        _orphans[:] = [p for p in _orphans if not p[0].Test()]


def _complete_at_exit() -> None:
    """Waits (bounded) for every orphan before MPI finalizes; runs before
    mpi4py's ``MPI_Finalize`` (atexit order)."""
    if not _orphans or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    deadline = time.monotonic() + EXIT_SECONDS
    while time.monotonic() < deadline:
        reap()
        if not _orphans:
            return
        time.sleep(1e-3)
    sys.stderr.write(f"mnpar: {len(_orphans)} message(s) sent by rank "
                     f"{MPI.COMM_WORLD.rank} were never received; exiting anyway\n")


atexit.register(_complete_at_exit)
