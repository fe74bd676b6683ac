"""Point-to-point transport: arrays over a private communicator, composed of parts.

A ``Transport`` owns ``Dup()`` of the user's communicator, so mnpar's
messages never match a receive the user posts on their own. It is made of
four parts, each one concept, none a parent class::

    Transport
      routes   _routes.Routes     rank and tag checks; one Route per peer and tag,
                                  the only holder of what a route remembers
      line     _ending.Line       what outlives the transport: the communicator,
                                  sends in flight, control messages, end notices
      outbox   _outbox.Outbox     how a send is posted: standard (a large send
               or _outbox.Eager   waits for its receiver) or eager (copies, never waits)
      reader   _message.Reader    decodes the headers landing in the receive buffer

**One send path.** ``send_arrays`` is the framing: every decision about
what a message becomes on the wire is made there, once, by the codec's
rules (``_message``)::

    one host array (first branch)
      the route's last           -> its payload alone                     outbox.send_one
        repeatable header
      inline_one (the rule)      -> one MPI message, header and payload   outbox.post
      in one piece               -> its header, then its memory;          outbox.send_one
                                    noted on the route if repeatable
    any other message
      fits_inline                -> one MPI message (GPU arrays through   outbox.post
                                    the host)
      else                       -> its header, then each array's         outbox.send_payload
                                    pieces (GPU memory where MPI can
                                    read it and the outbox keeps it)

The route, looked up first, is checked when it is made (``_routes``).
``Communicator.send`` (through ``send``) and the internal ``send_message``
of ``mnpar.functions`` and the pipeline reach it.

**One receive path.** ``_arrive`` waits for a message's first MPI message:
through the route's persistent receive (``Recv_init`` once, ``Start``
each time) into a reusable 64 KiB buffer, or, on a route whose last large
header is known, straight into a new array of that header (a message of
its size is the payload alone, anything else a first message read as
usual). The common message (one array inline, or a repeat) is returned
there; ``_arrays`` receives every other message's arrays. The wait for a
route's next message spins as long as its last large one took to move
(``likely``), and large arrays land in the receive pool (``_pool``).

Objects and control messages (``_objects``) share the communicator; ``free``
and the interpreter's exit end it (``_ending``). docs/protocol.rst gives the bytes.
"""
import sys
import weakref
from typing import Any, List, Optional, Sequence, Tuple, Type

import numpy as np
from mpi4py import MPI

from .._arrays import as_array_list, cupy_module
from .._errors import CommunicationError, MessageMismatchError
from .._failfast import failing, failure_text, will_abort
from . import _message as message
from ._ending import END, Line, drop
from ._message import INLINE, TUPLE, Header, Message, encode_one, inline_one
from ._outbox import Outbox
from ._pool import array_for
from ._routes import Routes
from ._wait import keep_waiting, settled, wait
from ._waiting import Waiting, What

INLINE_LIMIT = message.FIRST_LIMIT  # bytes of an inline message at most
MAX_CHUNK = message.MAX_CHUNK  # bytes per MPI call
REPORT_LIMIT = 8192  # bytes of an error report's text (``report``)
BYTE = MPI.BYTE
AN_OBJECT = "did it send an object (send_obj) that this rank receives with recv?"


class Transport:
    """Sends and receives arrays over a private communicator; see the module docstring.

    Args:
        mpi_comm: the user's communicator; it is duplicated, never used.
        timeout: seconds any wait may last, or None for no limit.
        cuda_aware: whether MPI can read and write GPU memory directly.
        outbox: how sends are posted: ``Outbox`` (standard), or ``Eager`` (the
            pipeline's channel: copies, never waits; ``flush`` waits for them all).
        via: how error texts name this transport's traffic (" through the pipeline").
    """

    def __init__(self, mpi_comm: MPI.Comm, timeout: Optional[float] = None,
                 cuda_aware: bool = False, outbox: Type[Outbox] = Outbox,
                 via: str = "") -> None:
        self.comm = mpi_comm.Dup()
        self.rank = self.comm.rank
        self.size = self.comm.size
        self.cuda_aware = cuda_aware
        self.via = via
        self.inline_limit = INLINE_LIMIT  # may be lowered (tests, benchmarks), never raised
        self.max_chunk = MAX_CHUNK
        upper = self.comm.Get_attr(MPI.TAG_UB)
        self.routes = Routes(self.rank, self.size, int(upper) if upper is not None else 32767)
        self._table = self.routes.table  # (the lookup of every message)
        # What must outlive this object: a transport garbage-collected without ``free``
        # leaves its line open until exit (``_ending``).
        self.line = Line(self.comm, self.routes, timeout, via)
        weakref.finalize(self, drop, self.line)
        self.outbox = outbox(self.line)
        self._status = MPI.Status()
        # Every message starts with one MPI message of at most this size: an inline
        # message, or the header of a large one.
        self._rbuf = np.empty(INLINE_LIMIT, np.uint8)
        self._reader = message.Reader(self._rbuf)
        self._abandoned: List[Tuple[MPI.Request, np.ndarray]] = []  # cancelled receives

    @property
    def timeout(self) -> Optional[float]:
        """Seconds any wait may last, or None (the line's, which its waits read)."""
        return self.line.timeout

    @timeout.setter
    def timeout(self, value: Optional[float]) -> None:
        self.line.timeout = value

    def describe(self, op: str, peer: Optional[int], tag: Optional[int], what: What,
                 watch: Optional[int] = None) -> Waiting:
        """What a wait of ``op`` waits for: its timeout text (``describe(elapsed)``), and
        whether ``peer`` (or ``watch``; every rank: None) has ended (``PeerFinished``)."""
        return Waiting(self.line, op, peer, tag, what, watch=watch)

    # -- the send path ----------------------------------------------------------

    def send(self, data: Any, dest: Any, tag: Any) -> None:
        """``Communicator.send``: sends an array or a tuple/list of arrays
        (``send_arrays``, whose route lookup checks ``dest`` and ``tag`` once per route;
        a value other than an exact int, a NumPy integer or a bool, is checked here)."""
        if type(dest) is not int or type(tag) is not int:  # (routes are keyed by ints)
            dest, tag = self.routes.check_route(dest, tag, "dest")
        if type(data) is np.ndarray:
            self.send_arrays((data,), 0, dest, tag)
            return
        arrays, is_tuple = as_array_list(data)
        self.send_arrays(arrays, TUPLE if is_tuple else 0, dest, tag)

    def send_message(self, msg: Message, dest: int, tag: int) -> None:
        """Sends ``msg`` (its arrays all NumPy or all cupy, None where one is absent) to
        ``dest``, checked by the caller: the pipeline's channel."""
        self.send_arrays(msg.arrays, msg.flags, dest, tag)

    def send_arrays(self, arrays: Sequence[Any], flags: int, dest: int, tag: int) -> None:
        """The framing: what a message of ``arrays`` with ``flags`` (``TUPLE``,
        ``GRADIENT``) becomes on the wire, decided here once (the module docstring's
        table) and handed to the outbox; ``dest`` and ``tag`` are checked with the route."""
        route = self._table.get((dest, tag)) or self.routes.route(dest, tag, "dest")
        if len(arrays) == 1 and isinstance(arrays[0], np.ndarray) and not flags & TUPLE:
            a = arrays[0]  # one host array: the common message
            sent = route.sent
            if sent is not None and sent == (a.dtype, a.shape, flags):
                self.outbox.send_one(None, a, dest, tag)  # ``dest`` knows its header
                return
            blob = inline_one(a, INLINE | flags, self.inline_limit)  # the frame rule
            if blob is not None:
                self.outbox.post(blob, dest, tag)
                return
            nbytes = a.nbytes
            if nbytes <= self.max_chunk:  # in one piece
                if message.repeatable(flags, nbytes, self.max_chunk):
                    route.sent, route.sent_bytes = (a.dtype, a.shape, flags), nbytes
                self.outbox.send_one(encode_one(a, flags), a, dest, tag)
                return
        if message.fits_inline(arrays, self.inline_limit):
            # A small GPU message goes through the host even where MPI is CUDA-aware:
            # one message that never waits beats a payload the receiver must post.
            arrays, gpu = message.to_wire(arrays)
            blob = message.pack(message.encode(arrays, flags | gpu | INLINE), arrays)
            self.outbox.post(blob, dest, tag)
            return
        arrays, gpu = message.to_wire(arrays, self.cuda_aware and self.outbox.keeps_device)
        header = message.encode(arrays, flags | gpu)
        if len(header) > INLINE_LIMIT:
            raise ValueError(f"a message of {len(arrays)} arrays needs a {len(header)}-byte "
                             f"header, over the {INLINE_LIMIT}-byte limit; send fewer "
                             "arrays per message")
        self.outbox.send_payload(header, arrays, bool(gpu), dest, tag, self.max_chunk)

    def report(self, text: str, dest: int, tag: int) -> None:
        """Sends ``dest`` an error report, fire and forget: its next receive from this
        rank with ``tag`` raises ``MessageMismatchError`` with ``text``. Always inline,
        whatever ``inline_limit``: every receive buffer holds ``REPORT_LIMIT`` bytes."""
        report = np.frombuffer(text.encode()[:REPORT_LIMIT], np.uint8)
        blob = message.pack(message.encode([report], INLINE | message.ERROR), [report])
        self.outbox.post(blob, dest, tag)

    # -- the receive path -------------------------------------------------------

    def recv(self, source: Any, tag: Any) -> Any:
        """``Communicator.recv``: receives what ``send`` sent, an array or a tuple of
        arrays (``source`` and ``tag`` checked as ``send`` checks them)."""
        if type(source) is not int or type(tag) is not int:
            source, tag = self.routes.check_route(source, tag, "source")
        header, got = self._arrive(source, tag)
        if got is not None:
            return got
        arrays = self._arrays(header, source, tag)
        return tuple(arrays) if header.flags & TUPLE else arrays[0]

    def recv_message(self, source: int, tag: int) -> Message:
        """The next message from ``source`` with ``tag`` (checked by the caller): its
        arrays (None where one is absent) and its flags (``TUPLE``, ``GRADIENT``).
        The pipeline's receive: its eager outbox releases the sends completed since."""
        header, a = self._arrive(source, tag)
        arrays = [a] if a is not None else self._arrays(header, source, tag)
        self.outbox.received()
        return Message(arrays, header.flags)

    def _arrive(self, source: int, tag: int) -> Tuple[Header, Optional[np.ndarray]]:
        """Waits for the first MPI message of the next message from ``source`` on ``tag``.

        On a route whose last repeatable header is known, into a new array of that
        header, posted before anything comes: a message of its size is the payload
        alone, any other at most 64 KiB, a first message, read from there. Else
        through the route's persistent receive into the receive buffer. Returns the
        header and, for the common message (one array inline, or a repeat's payload),
        that array, this rank's own; else None (``_arrays``).
        """
        route = self._table.get((source, tag)) or self.routes.route(source, tag, "source")
        known = route.known
        status = self._status
        a = None
        if known is not None:
            nbytes = known.nbytes
            dtype, shape = known.specs[0]
            a = array_for(shape, dtype, nbytes)
            req = self.comm.Irecv([a, BYTE], source, tag)
            try:
                if not settled([req], status):
                    keep_waiting([req], self.timeout, self.describe(
                        "recv", source, tag, f"a message from rank {source}"), status,
                        nbytes=nbytes)
            except BaseException as e:
                raise self._interrupted(e, req, a, source, tag) from None
            count = status.Get_count(BYTE)
            if count == nbytes:
                return known, a
            if count > self._rbuf.size:
                raise MessageMismatchError(
                    f"rank {self.rank}: rank {source} sent, on tag {tag}, {count} bytes that "
                    f"are neither the {nbytes}-byte array it sent last nor a message header: "
                    + AN_OBJECT)
            self._rbuf[:count] = a.reshape(-1).view(np.uint8)[:count]
        else:
            req = route.first or self.routes.make_first(self.comm, route, self._rbuf, source,
                                                        tag)
            req.Start()
            if not (req.Test(status) or settled([req], status)):
                try:
                    keep_waiting([req], self.timeout, self.describe(
                        "recv", source, tag, f"a message from rank {source}"), status,
                        likely=route.likely)
                except BaseException:
                    self.routes.drop_first(route)  # cancelled: freed, never started again
                    raise
        header, inline = self._reader.read()
        if inline is not None:
            return header, inline.copy()  # the buffer is reused: the array gets its own
        route.learn(header, self.max_chunk)  # as the sender noted it
        if a is not None and header.one_host and header.nbytes == a.nbytes:
            route.spare = a  # its payload may land where this message was posted
        return header, None

    def _interrupted(self, e: BaseException, req: MPI.Request, a: np.ndarray, source: int,
                     tag: int) -> BaseException:
        """What a receive posted for a repeat raises when its wait fails: a message too
        large for it is an object where an array was expected; else the wait's error,
        the receive cancelled (MPI may still write ``a``, which is kept)."""
        if isinstance(e, MPI.Exception) and e.Get_error_class() == MPI.ERR_TRUNCATE:
            return MessageMismatchError(
                f"rank {self.rank}: rank {source} sent, on tag {tag}, a message of more "
                f"than {a.nbytes} bytes where an array or a message header was expected: "
                + AN_OBJECT)
        if req != MPI.REQUEST_NULL and not isinstance(e, CommunicationError):
            try:  # a failed wait (a timeout, a lost peer) has cancelled it: never twice
                req.Cancel()  # (Open MPI crashes on a second cancel of one request)
            except MPI.Exception:
                pass
        self._abandoned.append((req, a))
        return e

    def _arrays(self, header: Header, source: int, tag: int) -> List[Any]:
        """The arrays of a message whose header ``_arrive`` returned without them: the one
        place that knows how each other frame arrives. An error report raises here."""
        if header.one_host and header.nbytes <= self.max_chunk:
            return [self._recv_one(header, source, tag)]  # one large host array
        if header.flags & INLINE:
            count = self._status.Get_count(BYTE)
            arrays: List[Any] = message.unpack(self._rbuf[:count].copy(), header)
            if header.flags & message.ERROR:
                text = arrays[0].tobytes().decode(errors="replace")
                raise MessageMismatchError(f"rank {self.rank}: rank {source} found, on tag "
                                           f"{tag}: {text}")
        else:  # a GPU payload straight into device memory where MPI can write it
            direct = (bool(header.flags & message.GPU) and self.cuda_aware
                      and cupy_module() is not None)
            arrays = self._recv_payload(header, source, tag, direct)
        return message.restore(arrays, header.flags, self.rank, source, self.via)

    def _recv_one(self, header: Header, source: int, tag: int) -> np.ndarray:
        """The payload of one large host array in one piece, into the memory posted for
        a repeat where it fits, else new; its receive is posted at once."""
        dtype, shape = header.specs[0]
        nbytes = header.nbytes
        route = self.routes.route(source, tag)
        route.likely = nbytes
        a = route.take_spare(dtype, shape)
        if a is None:
            a = array_for(shape, dtype, nbytes)
        reqs = [self.comm.Irecv([a, BYTE], source, tag)]
        if not settled(reqs):
            self._wait_payload(reqs, source, tag, nbytes)
        return a

    def _recv_payload(self, header: Header, source: int, tag: int,
                      direct: bool) -> List[Any]:
        """The arrays of any other large message, each in its ``pieces``: host arrays
        (page-locked where they go on to a GPU) or, ``direct``, cupy arrays."""
        self.routes.route(source, tag).likely = header.nbytes
        if not direct:
            arrays = message.host_buffers(header.specs, header.flags)
        else:
            cp = cupy_module()
            arrays = [None if dtype is None else cp.empty(shape, dtype)
                      for dtype, shape in header.specs]
            # The pool may hand back memory that queued kernels still use; MPI
            # writes it without waiting for them.
            cp.cuda.get_current_stream().synchronize()
        reqs = [self.comm.Irecv([chunk, BYTE], source, tag) for a in arrays
                if a is not None for chunk in message.pieces(a, self.max_chunk)]
        if not settled(reqs):
            self._wait_payload(reqs, source, tag, header.nbytes)
        return arrays

    def _wait_payload(self, reqs: List[MPI.Request], source: int, tag: int,
                      nbytes: int) -> None:
        """The rest of a payload's wait, once ``settled(reqs)`` said no."""
        keep_waiting(reqs, self.timeout, self.describe(
            "recv", source, tag, f"{nbytes} bytes of payload from rank {source}"), nbytes=nbytes)

    # -- the outbox, for the pipeline's channel -------------------------------

    def progress(self) -> None:
        """Lets MPI move the sends in flight and releases the completed ones."""
        self.outbox.progress()

    def pending_bytes(self) -> int:
        """Bytes of send buffers not yet released (the eager outbox's copies)."""
        return self.outbox.pending_bytes()

    @property
    def peak_pending_bytes(self) -> int:
        """The most ``pending_bytes`` has been since ``reset_peak`` (eager outbox)."""
        return self.outbox.peak_pending_bytes

    def reset_peak(self) -> None:
        """Starts ``peak_pending_bytes`` again from the bytes held now."""
        self.outbox.reset_peak()

    def flush(self) -> None:
        """Waits until every send in flight has been received."""
        self.outbox.flush()

    # -- the whole communicator --------------------------------------------------

    def arrive(self, op: str) -> None:
        """A barrier that honours the timeout; run before blocking collectives."""
        wait([self.comm.Ibarrier()], self.timeout,
             self.describe(op, None, None, "every rank to join the collective"))

    def free(self) -> None:
        """Ends the communicator (``_ending``), completes the sends in flight and frees
        it; it waits for every peer to end it too.

        MPI reuses a freed communicator's context: a message left unread (a
        control message, or an array a test sent and its peer never received)
        would match a receive on the next communicator and be taken for its
        message ("header version 0"); each is received first, with a warning.
        While an exception unwinds (``failing``) it only posts the end notices
        (``failed``) and returns: nothing in a cleanup path waits for a peer, so
        that the fail-fast abort runs; the rest is done at exit.
        """
        if self.comm == MPI.COMM_NULL:
            return
        if failing():
            self.line.announce(failure_text(sys.exc_info()[1]), will_abort())
            return
        self.line.announce("called finalize() on the communicator")
        self.line.drain(END, report=True)
        self.line.held.clear()  # announcements for models this rank is not in
        self.outbox.flush()
        self.routes.free_requests()
        self.line.close()
        self.comm.Free()
