"""What a wait waits for, and where this rank is: the words of every wait's failure.

A wait that fails says who waited for whom: ``rank 1: recv with rank 0, tag
4 did not complete after 600.0 s ...; waiting for a message from rank 0``.
Every blocking wait in mnpar (``_wait.wait``) is handed a ``Waiting``, which
builds that text only when it is needed and, once a second while the wait
sleeps, asks whether the peer it waits on has ended (``finished``: the
``PeerFinished`` text, from that peer's end ``Notice``).

Where this rank is (``note_progress``: ``iteration 12 of its
PipelineUpdater``) is noted once per forward or update by the layers that
loop, and read here and by the end notice a rank posts when it finishes
(``_ending``), so that every such text says how far each rank got. The
teardown (``_ending``) and the waits (here) are apart because every wait
needs these words, and only the end of a communicator needs the teardown.
"""
from typing import Callable, Dict, NamedTuple, Optional, Protocol, Tuple, Union

ABORT_GRACE = 10.0  # seconds a wait lets a failing peer's abort come first

_progress: Dict[str, Union[str, int, None]] = {"what": None, "count": 0}


def note_progress(what: str, count: int) -> None:
    """Remembers where this rank is (``"iteration {} of its PipelineUpdater", 12``: a
    format with one field), for its end notice and its ``PeerFinished`` messages;
    called once per forward or update, and costs two stores."""
    _progress["what"] = what
    _progress["count"] = count


def where(preposition: str = "after") -> str:
    """`` after iteration 12 of its PipelineUpdater``; nothing before the first note."""
    what = _progress["what"]
    return f" {preposition} {str(what).format(_progress['count'])}" if what else ""


class Notice(NamedTuple):
    """A peer's end notice: how it ended and where, and whether its fail-fast abort
    is on its way."""

    how: str
    where: str
    aborting: bool = False
    senders: Optional[Dict[int, str]] = None  # tag -> what sent this rank messages with it

    def __str__(self) -> str:
        return f"{self.how}{self.where}"


class Peers(Protocol):
    """What a ``Waiting`` asks of a transport's line (``_ending.Line``)."""

    rank: int
    timeout: Optional[float]

    def finished(self, peer: Optional[int]) -> Optional[Tuple[int, Notice]]:
        """``(rank, notice)`` of ``peer`` if it has ended, or, with None, of any peer."""


What = Union[str, Callable[[], str]]


class Waiting:
    """What a wait waits for: its ``CommunicationTimeout`` text (``waiting(elapsed)``)
    and, once a second while it sleeps, whether the peer it waits on (every peer,
    for a collective) has ended (``finished``: the ``PeerFinished`` text, or None).

    ``what`` may be a function of no argument, read only when a text is built.
    ``watch`` is the peer whose end fails the wait, where the text names none
    (default: ``peer``); ``check=False`` never asks (the drain at the end, which
    waits for peers that have ended).
    """

    __slots__ = ("line", "op", "peer", "tag", "what", "check", "watch")

    def __init__(self, line: Peers, op: str, peer: Optional[int], tag: Optional[int],
                 what: What, check: bool = True, watch: Optional[int] = None) -> None:
        self.line, self.op, self.peer, self.tag, self.what = line, op, peer, tag, what
        self.check = check
        self.watch = peer if watch is None else watch

    def _subject(self) -> str:
        where_ = f" with rank {self.peer}" if self.peer is not None else ""
        tagged = f", tag {self.tag}" if self.tag is not None else ""
        return f"rank {self.line.rank}: {self.op}{where_}{tagged}"

    def _what(self) -> str:
        return self.what() if callable(self.what) else self.what

    def __call__(self, elapsed: float) -> str:
        return (f"{self._subject()} did not complete after {elapsed:.1f} s (timeout "
                f"{self.line.timeout} s); waiting for {self._what()}")

    def finished(self) -> Optional[Tuple[str, float]]:
        """The ``PeerFinished`` text and how long the wait may still go on (a message
        on its way, a failing peer's abort), once the peer waited on has ended."""
        if not self.check:
            return None
        found = self.line.finished(self.watch)
        if found is None:
            return None
        rank, notice = found
        own = f" (this rank is{where('in')})" if _progress["what"] else ""
        return (f"{self._subject()} cannot complete: rank {rank} {notice}{own}; waiting for "
                f"{self._what()}", ABORT_GRACE if notice.aborting else 0.0)
