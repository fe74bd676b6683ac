"""How a rank finishes with a communicator: it says so, and leaves nothing unread.

MPICH's ``MPI_Finalize`` waits for every rank. A rank whose program had
ended sat there, silent, while a peer waited its whole timeout for a message
that would never come. Now a rank that finishes with a transport
(``Communicator.finalize()``, or the interpreter's exit for every transport
still open, dropped ones included) first posts an *end notice* to every
peer on the control tag, saying how and where it ended, and only then
waits: for each peer's own notice, receiving whatever that peer sent before
it::

    rank a (finishes first)                 rank b
    end notice -> b                         recv from a ... (a wait)
    waits for b's notice                    sees a's notice: PeerFinished

* A wait for a rank that has finished fails within a second or two
  (``_waiting.Waiting.finished``, asked once a second by a wait that sleeps) with
  ``PeerFinished``: which rank, how it ended, its last iteration, what this
  rank waited for. MPI delivers one sender's messages in order, so a notice
  comes after everything its rank sent; a message already on its way gets
  ``FINISH_GRACE`` seconds more to complete (``_wait``).
* Whatever a peer sent that nobody read is received before the
  communicator goes: an ``UnreadMessageWarning`` for each array or object,
  silence for mnpar's own control messages (wiring announcements to ranks
  outside a model). Nothing is left for ``MPI_Finalize`` (across hosts MPI
  warns of each unmatched message) or for the next communicator, which may
  get this one's MPI context again. The warning names what sent it: the
  pipeline (its own channel), ``comm.send_obj`` (a pickled object), or the
  construct the sender named for that route and tag (``name_sender``: a
  ``MultiNodeChainList``), which its end notice carries, read after the
  messages it sent; anything else is a user's ``comm.send`` or
  ``mnpar.functions.send``. (Collectives leave no message to read: a rank
  that skips one leaves its peers waiting, and their timeout names it.)
* A rank that is failing (an exception unwinding through a cleanup path,
  ``failing()``) waits for no peer: its cleanup posts its notices
  (``failed (...)``) and returns at once, so the fail-fast hook's abort runs.
  Its peers, told that an abort is coming, let it come (``_waiting.ABORT_GRACE``)
  rather than print an error of their own; without fail-fast they raise
  ``PeerFinished`` after the usual grace. At exit, a rank whose program died
  of an exception posts its notices and leaves.

What a wait says and where this rank is (``Waiting``, ``note_progress``)
are ``_waiting``'s; what each route remembers (a repeat's header, which
tells the drain what an unread payload is) is ``_routes``'s, kept here on the
line so that it outlives a dropped transport.
"""
import atexit
import pickle
import struct
import sys
import time
from functools import partial
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
from mpi4py import MPI

from .._errors import CommunicationError, warn_unread
from .._failfast import died, failure_text
from . import _liveness as liveness
from . import _message as message
from ._routes import Routes
from ._wait import probe
from ._waiting import Notice, Waiting, where

__all__ = ["END", "MARK", "Line", "drop", "reap_dropped"]

END, MARK = "mnpar-end", "mnpar-mark"  # control payloads: a rank's last, a drain's round
SETTLE_SECONDS = 5.0  # how long an ending rank waits for its own sends in flight
Pending = Tuple[MPI.Request, Optional[Union[bytes, np.ndarray]], int, int]  # req, buf, dest, tag


class Line:
    """A transport's MPI state that may outlive it: the private communicator, the
    sends in flight, control messages set aside, and the peers' end notices.

    Every line is registered here until it is closed; one whose transport was
    dropped without ``finalize()`` is ended at exit like the others.
    """

    def __init__(self, comm: MPI.Comm, routes: Routes, timeout: Optional[float],
                 via: str) -> None:
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size
        self.routes = routes  # what each route remembers; its control tag
        self.control_tag = routes.control_tag
        self.timeout = timeout
        self.via = via
        self.pending: List[Pending] = []  # sends in flight (the outbox's)
        self.held: List[Tuple[int, Any]] = []  # control messages set aside: (source, payload)
        self.ended: Dict[int, Notice] = {}
        self.marks: Dict[int, int] = {}  # discard_unread's rounds read out of turn, per peer
        self.announced = False
        self.status = MPI.Status()
        _open.append(self)

    # -- control messages ----------------------------------------------------

    def take_control(self, source: int = MPI.ANY_SOURCE) -> None:
        """Reads the control messages that have arrived: end notices are noted, the
        others set aside for ``poll_control``."""
        status = self.status
        while (msg := self.comm.improbe(source, self.control_tag, status)) is not None:
            self.control(status.Get_source(), msg.recv())

    def control(self, source: int, payload: Any) -> None:
        """Files one control message read from ``source``."""
        if type(payload) is tuple and payload[:1] == (END,):
            self.ended[source] = Notice(*payload[1:])
        elif type(payload) is tuple and payload[:1] == (MARK,):
            self.marks[source] = self.marks.get(source, 0) + 1
        else:
            self.held.append((source, payload))

    def finished(self, peer: Optional[int]) -> Optional[Tuple[int, Notice]]:
        """``(rank, notice)`` of ``peer`` if it has ended, or, with None, of any peer."""
        self.take_control()
        if peer is None:
            return next(iter(self.ended.items()), None)
        notice = self.ended.get(peer)
        return None if notice is None else (peer, notice)

    # -- ending --------------------------------------------------------------

    def announce(self, how: str, aborting: bool = False) -> None:
        """Posts this rank's end notice to every peer (once); never waits."""
        if self.announced or self.comm == MPI.COMM_NULL:
            return
        self.announced = True
        at = where()
        for peer in range(self.size):
            if peer != self.rank:
                self._post(peer, (END, how, at, aborting, self.routes.senders(peer)))

    def mark(self) -> None:
        """Posts a mark to every peer: the end of ``discard_unread``'s round."""
        self._post_all((MARK,))

    def _post_all(self, payload: Tuple[str]) -> None:
        for peer in range(self.size):
            if peer != self.rank:
                self._post(peer, payload)

    def _post(self, peer: int, payload: Tuple[Any, ...]) -> None:
        req = self.comm.isend(payload, peer, self.control_tag)
        self.pending.append((req, None, peer, self.control_tag))

    def drain(self, until: str, report: bool) -> int:
        """Receives every peer's messages up to its ``until`` payload (``END``: its end
        notice; ``MARK``: one posted by ``discard_unread``); returns how many were
        dropped, warning of each array or object when ``report``."""
        dropped = 0
        for peer in range(self.size):
            if peer == self.rank:
                continue
            describe = Waiting(self, "finalize", peer, None, f"rank {peer} to finish with the "
                               "communicator too" if until == END else
                               f"rank {peer} to discard its unread messages too", check=False)
            unread: List[Tuple[str, Optional[int]]] = []
            while True:
                got = probe(partial(self._next_from, peer, until), self.timeout, describe)
                if not isinstance(got, MPI.Message):  # nothing left before ``until``
                    break
                text = self._receive(got, peer, until)
                if text is None:  # the ``until`` payload
                    break
                dropped += 1
                if text[0] and report:
                    unread.append(text)
            for what, tag in unread:  # the sender's end notice, which names it, is in
                sent_by = "" if tag is None else f" sent by {self._sender(peer, tag)}"
                warn_unread(f"rank {self.rank}: a message from rank {peer} was never "
                            f"received: {what}{sent_by}")
        return dropped

    def _next_from(self, peer: int, until: str) -> Union[MPI.Message, bool, None]:
        """The next message from ``peer``; False when its end notice (or mark), read
        earlier out of turn, has nothing left before it; None: nothing yet."""
        msg = self.comm.Improbe(peer, MPI.ANY_TAG, self.status)
        if msg is None:
            if until == END and peer in self.ended:
                return False
            if until == MARK and self.marks.get(peer):
                self.marks[peer] -= 1
                return False
        return msg

    def _receive(self, msg: MPI.Message, peer: int,
                 until: str) -> Optional[Tuple[str, Optional[int]]]:
        """Receives the message ``msg`` (and a large one's payload): its description and,
        for an array message, its tag (``_sender`` names the sender once the peer's end
        notice is in); ("", None) for a control message, None for an end notice or a mark.

        Before ending, a large message's payload is received only once its sender
        has ended too: a sender still waiting in ``send`` for it then learns that
        this rank has finished (``PeerFinished``), rather than going on as if its
        message had been read.
        """
        status = self.status
        tag = status.Get_tag()
        count = status.Get_count(MPI.BYTE)
        route = self.routes.find(peer, tag)
        known = route.payload(count) if route is not None else None
        if known is not None:  # a repeat: the payload alone (``_routes``)
            if until == END:
                probe(partial(self._ended, peer), self.timeout, self._payload_waiting(peer, tag))
            msg.Recv([np.empty(count, np.uint8), MPI.BYTE])
            return f"tag {tag}, {count} bytes: {_arrays(known)}", tag
        buf = np.empty(count, np.uint8)
        msg.Recv([buf, MPI.BYTE])
        if tag == self.control_tag:
            payload = pickle.loads(buf.tobytes())
            if type(payload) is tuple and payload[:1] in ((END,), (MARK,)):
                if payload[0] == END:
                    self.ended[peer] = Notice(*payload[1:])
                return None
            return "", None  # a wiring announcement no model of this rank read
        if not buf.size or buf[0] != message.VERSION:
            return (f"tag {tag}, {buf.size} bytes: a pickled object sent by "
                    f"comm.send_obj{self.via}", None)
        try:
            header = message.decode(buf)
        except (RuntimeError, KeyError, struct.error):  # not mnpar's: whatever it is, it is read
            return f"tag {tag}, {buf.size} bytes that are no message of mnpar", None
        if not header.flags & message.INLINE:  # the payload follows, one message an array
            self.routes.route(peer, tag).learn(header, message.MAX_CHUNK)  # as a receive does
            waiting = self._payload_waiting(peer, tag)
            if until == END:
                probe(partial(self._ended, peer), self.timeout, waiting)
            for _ in header.specs:
                payload = probe(partial(self.comm.Improbe, peer, tag, status), self.timeout,
                                waiting)
                payload.Recv([np.empty(status.Get_count(MPI.BYTE), np.uint8), MPI.BYTE])
        return f"tag {tag}, {header.nbytes} bytes: {_arrays(header)}", tag

    def _payload_waiting(self, peer: int, tag: int) -> Waiting:
        """What the drain waits for before and while it reads a large message's payload."""
        return Waiting(self, "finalize", peer, tag, f"rank {peer} to finish with the "
                       "communicator too (it sent a message this rank never received)",
                       check=False)

    def _ended(self, peer: int) -> Optional[bool]:
        """True once ``peer``'s end notice is here (a ``probe`` poll)."""
        self.take_control(peer)
        return True if peer in self.ended else None

    def _sender(self, peer: int, tag: int) -> str:
        """What sent ``peer``'s array message with ``tag``: as its end notice names it."""
        if self.via:
            return "a pipeline transfer"
        notice = self.ended.get(peer)
        named = (notice.senders or {}).get(tag) if notice is not None else None
        return named or "comm.send or mnpar.functions.send"

    def settle_sends(self, seconds: float) -> None:
        """Waits up to ``seconds`` for this rank's sends in flight (its peers have
        drained it by now); warns of each that never completed."""
        deadline = time.monotonic() + seconds
        while self.pending and time.monotonic() < deadline:
            self.pending[:] = [p for p in self.pending if not p[0].Test()]
            if self.pending:
                time.sleep(1e-3)
        for _, buf, dest, tag in self.pending:
            if tag != self.control_tag:
                size = f"{len(buf)} bytes" if buf is not None else "a pickled object"
                why = self.ended.get(dest)
                warn_unread(f"rank {self.rank}: a message to rank {dest} was never received: "
                            f"tag {tag}, {size}; rank {dest} "
                            + (str(why) if why else "never finished with the communicator"))

    def free_requests(self) -> None:
        """Frees the persistent receives (none is active between messages)."""
        self.routes.free_requests()

    def close(self) -> None:
        """Forgets this line: its communicator is freed or the process is ending."""
        if self in _open:
            _open.remove(self)
        if self in _dropped:
            _dropped.remove(self)

    def end(self, how: str) -> None:
        """The whole ending: notice, drain (warning of what was never read), sends settled."""
        self.announce(how)
        self.drain(END, report=True)
        self.settle_sends(SETTLE_SECONDS)
        self.free_requests()


def _arrays(header: message.Header) -> str:
    specs = [f"{dtype} {tuple(shape)}" for dtype, shape in header.specs]
    back = " (gradients sent back)" if header.flags & message.GRADIENT else ""
    if header.flags & message.TUPLE or len(specs) != 1:
        return f"a tuple of {len(specs)} arrays ({', '.join(specs)}){back},"
    dtype, shape = header.specs[0]
    return f"a {dtype} array of shape {tuple(shape)}{back},"


_open: List[Line] = []  # every line not closed, in the order they were made
_dropped: List[Line] = []  # lines whose transport was garbage-collected


def drop(line: Line) -> None:
    """A transport was garbage-collected without ``finalize()``: its line stays open
    until exit (its sends must complete, its peers learn that it ended then)."""
    line.free_requests()
    if line in _open and line.pending:
        _dropped.append(line)


def reap_dropped() -> None:
    """Forgets the completed sends of dropped transports, and the dropped transports
    with none left (they stay open, to be ended at exit)."""
    if _dropped:
        for line in _dropped:
            line.pending[:] = [p for p in line.pending if not p[0].Test()]
        _dropped[:] = [line for line in _dropped if line.pending]


def _at_exit() -> None:
    """Ends every open line before MPI finalizes (mpi4py's ``MPI_Finalize`` runs after
    every ``atexit`` handler): notices first, on every line, so that no peer waits on
    this rank in vain while it drains; then the drains; then the heartbeat's goodbye."""
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    lines = list(_open)
    exc = died()
    how = failure_text(exc) if exc is not None else "has finished: its program ended"
    for line in lines:
        line.announce(how)
    if exc is None:
        for line in lines:
            try:
                line.drain(END, report=True)
                line.settle_sends(SETTLE_SECONDS)
            except CommunicationError as e:
                sys.stderr.write(f"mnpar: {e}; exiting without it\n")
    for line in lines:
        line.free_requests()
        line.close()
    liveness.stop()


atexit.register(_at_exit)
