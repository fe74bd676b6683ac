"""Fail fast: an uncaught exception on one rank ends the whole job.

Without this, a rank that dies leaves its peers waiting forever in a receive
or a collective. Importing mnpar installs ``sys.excepthook``: the traceback
is printed once, every line marked with the rank, and ``MPI_Abort`` ends all
ranks of the job. Exceptions that something catches (pytest's own handling
included) never reach the hook. ``MNPAR_ABORT_ON_ERROR=0`` turns it off.
"""
import os
import sys
import traceback

ENV = "MNPAR_ABORT_ON_ERROR"
_previous = None


def _hook(exc_type, exc, tb) -> None:
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.size == 1:
        (_previous or sys.__excepthook__)(exc_type, exc, tb)
        return
    rank = MPI.COMM_WORLD.rank
    lines = "".join(traceback.format_exception(exc_type, exc, tb)).rstrip("\n").split("\n")
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in lines))
    sys.stderr.write(f"[rank {rank}] mnpar: aborting every rank of the job "
                     f"(set {ENV}=0 to turn this off)\n")
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)


def install() -> None:
    """Installs the hook unless ``MNPAR_ABORT_ON_ERROR=0``; safe to call twice."""
    global _previous
    if os.environ.get(ENV, "1") == "0" or sys.excepthook is _hook:
        return
    _previous = sys.excepthook
    sys.excepthook = _hook
