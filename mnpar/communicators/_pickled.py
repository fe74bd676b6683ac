"""Sends that never wait: users' objects, mnpar's control messages, small arrays.

Objects and control messages travel on the transport's private
communicator, pickled by mpi4py; they, small (inline) arrays and error
reports are sent fire and forget, each kept in the transport's sends in
flight (``_post``) until MPI is done with its buffer. Control
messages (the wiring check, end notices) use the reserved top tag; a receive
of any tag that meets one sets it aside for ``poll_control`` rather than
hand it to the user. ``Transport`` inherits these methods.

On a route where an array's payload may come without its header
(``_repeats``), an object is pickled here rather than by mpi4py, so that
its size is never that payload's, and ``recv_obj`` refuses such a payload.
"""
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .._errors import MessageMismatchError
from . import _message as message
from ._ending import MARK, Line, Waiting, reap_dropped
from ._repeats import Repeats
from ._wait import probe, wait

REAP_EVERY = 16  # completed sends are forgotten in batches of this many
MAX_PENDING = 256  # small sends kept in flight before the oldest is waited for
REPORT_LIMIT = 8192  # bytes of an error report's text (``report``)


class PickledMessages(Repeats):
    """Objects (``send_obj``/``recv_obj``) and control messages over the transport."""

    comm: MPI.Comm
    timeout: Optional[float]
    line: Line
    _pending: List[Tuple[MPI.Request, Any, int, int]]
    _held_control: List[Tuple[int, Any]]

    eager: bool

    if TYPE_CHECKING:  # what ``Transport`` provides
        def describe(self, op: str, peer: Optional[int], tag: Optional[int], what: Any,
                     watch: Optional[int] = None) -> Waiting: ...

    def send_obj(self, obj: Any, dest: int, tag: int = 0) -> None:
        dest = self.check_peer(dest, "dest")
        tag = self.check_tag(tag)
        avoid = self._pickled_size(dest, tag)
        if avoid is None:
            req = self.comm.isend(obj, dest, tag)
        else:  # pickled as mpi4py does, never to a repeated array's size
            data = MPI.pickle.dumps(obj)
            if len(data) == avoid:
                data += b"\0"  # after the pickle's end: ignored
            req = self.comm.Isend([data, MPI.BYTE], dest, tag)  # the request keeps ``data``
        self._pending.append((req, None, dest, tag))
        if len(self._pending) >= REAP_EVERY:
            self._reap()

    def recv_obj(self, source: int, tag: int = MPI.ANY_TAG,
                 status: Optional[MPI.Status] = None) -> Any:
        """Receives an object from ``source`` with ``tag`` (any tag by default);
        ``status`` gets its source and tag."""
        source = self.check_peer(source, "source")
        if tag != MPI.ANY_TAG:
            tag = self.check_tag(tag)
        status = MPI.Status() if status is None else status
        msg = probe(lambda: self._improbe_user(source, tag, status), self.timeout,
                    self.describe("recv_obj", source, None if tag == MPI.ANY_TAG else tag,
                                  f"an object from rank {source}"))
        known = self._known.get((source, status.Get_tag()))
        if known is not None and status.Get_count(MPI.BYTE) == known.nbytes:
            msg.Recv([np.empty(known.nbytes, np.uint8), MPI.BYTE])  # its sender goes on
            dtype, shape = known.specs[0]
            raise MessageMismatchError(
                f"rank {self.rank}: recv_obj from rank {source} on tag {status.Get_tag()} "
                f"met a {dtype} array of shape {tuple(shape)} that rank {source} sent with "
                "send; receive it with recv")
        return msg.recv()

    def _improbe_user(self, source: int, tag: int, status: MPI.Status) -> Optional[MPI.Message]:
        """``improbe``; a control message any tag matched is set aside for ``poll_control``."""
        msg = self.comm.improbe(source, tag, status)
        if msg is not None and status.Get_tag() == self.control_tag:
            self.line.control(status.Get_source(), msg.recv())
            return None
        return msg

    def post_control(self, payload: Any, dest: int) -> None:
        """Sends a pickled control message, fire and forget (``free`` drops it if unread)."""
        self._pending.append((self.comm.isend(payload, dest, self.control_tag), None, dest,
                              self.control_tag))
        if len(self._pending) >= REAP_EVERY:
            self._reap()

    def poll_control(self) -> Optional[Tuple[int, Any]]:
        """The next control message that has arrived, as ``(source, payload)``, or None
        (end notices are the line's, never returned)."""
        if not self._held_control:
            self.line.take_control()
        return self._held_control.pop(0) if self._held_control else None

    def discard_unread(self) -> int:
        """Receives and drops every message sent here and not yet read. Collective.

        Each rank posts every peer a mark on the control tag; MPI delivers one
        sender's messages in order to a receive that matches them all (any
        tag), so everything a peer sent before its mark, arrays, objects and
        control messages alike, is received and dropped here, silently.
        Returns how many were dropped.
        """
        self.line.mark()
        dropped = self.line.drain(MARK, report=False) + len(self._held_control)
        self._held_control.clear()
        return dropped

    # -- sends that never wait: small arrays, error reports ----------------------

    def _post(self, buf: Any, dest: int, tag: int) -> None:
        """Starts a small send; its buffer lives in ``_pending`` until done."""
        pending = self._pending
        pending.append((self.comm.Isend([buf, MPI.BYTE], dest, tag), buf, dest, tag))
        if len(pending) >= REAP_EVERY:
            self._reap()

    def _reap(self) -> None:
        """Forgets completed small sends; bounds how many stay in flight."""
        pending = self._pending
        if len(pending) >= MAX_PENDING and not self.eager:
            req, _, dest, tag = pending[0]
            wait([req], self.timeout, self.describe(
                "send", dest, tag, "the oldest of many small sends to be received"))
        pending[:] = [p for p in pending if not p[0].Test()]
        reap_dropped()

    def flush(self) -> None:
        """Waits until every send in flight has been received."""
        if self._pending:
            wait([p[0] for p in self._pending], self.timeout, self.describe(
                "flush", None, None, "small sends in flight to be received"))
        self._pending.clear()

    def report(self, text: str, dest: int, tag: int) -> None:
        """Sends ``dest`` an error report, fire and forget: its next receive from
        this rank with ``tag`` raises ``MessageMismatchError`` with ``text``."""
        report = np.frombuffer(text.encode()[:REPORT_LIMIT], np.uint8)
        flags = message.INLINE | message.ERROR
        self._post(message.pack(message.encode([report], flags), [report]), dest, tag)
