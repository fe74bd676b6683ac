"""Fail fast: an uncaught exception on one rank ends the whole job.

Without this, a rank that dies leaves its peers waiting forever in a receive
or a collective. Importing mnpar installs ``sys.excepthook``: the traceback
is printed once, every line marked with the rank, and ``MPI_Abort`` ends all
ranks of the job (a rank whose abort has not ended it after 5 s, cut off
from the launcher, ends itself). Before the abort it waits, at most a second,
for the other ranks' failures (the heartbeat carries the word): an error
raised on every rank is printed by every rank. Exceptions that something
catches (pytest's own handling included) never reach the hook.
``MNPAR_ABORT_ON_ERROR=0`` turns it off.

What a program writes to ``sys.stderr`` while it handles an exception is
marked with the rank too (``RankedLines``): chainer's ``Trainer`` prints the
exception and its traceback in its ``except`` block, before the hook sees it,
and in a job of several ranks those lines would say nothing of where they
came from. Other output is left as it is.
"""
import fcntl
import os
import signal
import stat
import sys
import termios
import time
import traceback
from typing import Callable, Optional

ENV = "MNPAR_ABORT_ON_ERROR"
DRAIN_SECONDS = 2.0  # the longest the hook waits for the launcher to read the traceback
TOGETHER_SECONDS = 1.0  # the longest it waits for the other ranks' failures to print
ABORT_GRACE = 5  # seconds MPI_Abort may take before the rank ends itself
_previous = None
# Set by the heartbeat (``communicators._liveness``) where it runs: tells the other
# ranks this one is failing and waits, bounded, for theirs.
before_abort: Optional[Callable[[float], None]] = None


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
    for stream in (sys.stdout, sys.stderr):
        _drain(stream)
    if before_abort is not None:
        try:
            before_abort(TOGETHER_SECONDS)
        except Exception:  # MPI in a bad state: abort all the same
            pass
    # MPI_Abort asks the launcher to end every rank; cut off from it (a lost
    # host), it may never return, holding the GIL: the kernel's alarm ends this
    # rank a little later anyway (SIGALRM's default action).
    try:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(ABORT_GRACE)
    except ValueError:  # not the main thread: no alarm to set
        pass
    MPI.COMM_WORLD.Abort(1)


def _drain(stream) -> None:
    """Flushes ``stream`` and, if it is a pipe, waits until its reader took every byte.

    ``mpiexec`` reads each rank's output through a pipe; an abort that comes
    before the launcher has read the traceback loses it (seen with MPICH's
    hydra, about once in 30 crashes).
    """
    try:
        stream.flush()
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
    except (OSError, ValueError, AttributeError):
        return  # closed or replaced stream: nothing more to wait for
    unread = bytearray(4)
    deadline = time.monotonic() + DRAIN_SECONDS
    while time.monotonic() < deadline:
        fcntl.ioctl(fd, termios.FIONREAD, unread)
        if not int.from_bytes(unread, sys.byteorder):
            return
        time.sleep(0.005)


def _fatal(exc: Optional[BaseException]) -> bool:
    """Whether ``exc`` ends a program in error (``sys.exit(0)`` does not)."""
    if exc is None or isinstance(exc, GeneratorExit):
        return False
    return not (isinstance(exc, SystemExit) and exc.code in (None, 0))


def failing() -> bool:
    """Whether an exception is unwinding through the caller: a ``finally`` or
    ``except`` block (chainer's Trainer finalizes its updater and extensions in
    one before it re-raises). mnpar's cleanup then stays local and quick, waits
    for no peer, so that the abort of this hook runs: the peers may themselves
    be waiting for this rank."""
    return _fatal(sys.exc_info()[1])


def failure_text(exc: Optional[BaseException]) -> str:
    """How a rank that fails with ``exc`` ended, for its peers: ``failed (ValueError: x)``,
    with the exception's notes (where in a pipeline stage it was raised, say)."""
    notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))
    return f"failed ({type(exc).__name__}: {exc}{notes})"


def will_abort() -> bool:
    """Whether an exception that reaches the top ends the job (this module's hook)."""
    return sys.excepthook is _hook


def died() -> Optional[BaseException]:
    """At exit: the exception that ended the program, if one did (the interpreter
    keeps the last uncaught exception in ``sys.last_value``)."""
    exc = getattr(sys, "last_value", None)
    return exc if _fatal(exc) else None


class RankedLines:
    """A text stream (``sys.stderr``) whose lines written while an exception is being
    handled start with ``[rank N] `` in a job of several ranks; everything else of the
    stream is the stream's own."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self._line_start = True

    def write(self, text: str) -> int:
        prefix = _label() if text and sys.exc_info()[0] is not None else None
        if prefix is None:
            if text:
                self._line_start = text.endswith("\n")
            return self.stream.write(text)
        out = []
        for piece in text.splitlines(keepends=True):
            if self._line_start and not piece.startswith("[rank "):
                out.append(prefix)
            out.append(piece)
            self._line_start = piece.endswith("\n")
        self.stream.write("".join(out))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


_rank_label: Optional[str] = None


def _label() -> Optional[str]:
    """``[rank N] `` once MPI runs with several ranks, else None."""
    global _rank_label
    if _rank_label is None:
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
            return None
        world = mpi.COMM_WORLD
        _rank_label = f"[rank {world.rank}] " if world.size > 1 else ""
    return _rank_label or None


def install(force: bool = False) -> None:
    """Installs the hook unless ``MNPAR_ABORT_ON_ERROR=0`` (or ``force``), and the rank
    marks on ``sys.stderr``; safe to call twice."""
    global _previous
    if sys.stderr is not None and not isinstance(sys.stderr, RankedLines):
        sys.stderr = RankedLines(sys.stderr)
    if (os.environ.get(ENV, "1") == "0" and not force) or sys.excepthook is _hook:
        return
    _previous = sys.excepthook
    sys.excepthook = _hook
