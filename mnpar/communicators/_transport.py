"""Point-to-point transport: arrays and objects over a private communicator.

Design (why it is fast and safe):

* All traffic runs on ``Dup()`` of the user's communicator, so mnpar's
  messages never match a receive the user posts on their own communicator.
* A small message (header plus inline payload up to ``inline_limit`` bytes)
  is ONE ``Isend``: the call returns at once and the request is completed
  later, so a small send never waits for its receiver. A large message is
  the header, then each array's own memory (no copy), in chunks of at most
  ``max_chunk`` bytes so that counts stay within MPI's ``int``; the sender
  waits for it to complete, as MPI's standard mode does; an ``eager``
  transport (the pipeline's channel) copies the arrays and never waits.
  An array with the same header as the route's last large one goes as its
  payload alone, into a receive posted before it arrives (``_repeats``).
* The receiver starts a persistent receive (one per source and tag) into a
  reusable 64 KiB buffer and decodes the header there; inline arrays get one
  copy of their own, large ones are received straight into their own arrays
  (see docs/protocol.rst).
* Control messages (the wiring check, end notices) use the reserved top tag.
  ``free`` and the interpreter's exit end the communicator (``_ending``): an
  end notice to every peer, then every message left unread is received,
  control or not, before MPI can recycle the communicator's context.
* Only standard-mode (non-blocking) sends; every wait honours the timeout.
* A gradient that ``recv``'s backward sends back is flagged as one in its
  header, so a receiver can tell it from activations at no cost; a rank that
  finds a message out of place sends its peer an error report (``report``),
  which that peer's next receive from it on the same tag raises.
"""
import sys
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .._arrays import as_array_list, cupy_module, sync_device
from .._errors import MessageMismatchError
from .._failfast import failing, failure_text, will_abort
from . import _message as message
from ._ending import END, Line, Waiting, drop
from ._pickled import PickledMessages
from ._pool import copied
from ._wait import keep_waiting, settled, wait

INLINE_LIMIT = message.FIRST_LIMIT  # bytes of an inline message at most
MAX_CHUNK = message.MAX_CHUNK  # bytes per MPI call
MAX_FIRST = 256  # persistent receives kept (one per source and tag) before starting afresh
BYTE = MPI.BYTE  # (one lookup less on the paths of a repeat)

class Transport(PickledMessages):
    """Sends and receives arrays and objects; owns the private communicator.

    Args:
        mpi_comm: the user's communicator; it is duplicated, never used.
        timeout: seconds any wait may last, or None for no limit.
        cuda_aware: whether MPI can read and write GPU memory directly.
        eager: sends never wait for their receiver, large ones included (the
            pipeline's schedules are proven deadlock-free for such sends);
            ``flush`` waits for them all.
        via: how error texts name this transport's traffic (" through the pipeline").
    """

    def __init__(self, mpi_comm: MPI.Comm, timeout: Optional[float] = None,
                 cuda_aware: bool = False, eager: bool = False, via: str = "") -> None:
        self.comm = mpi_comm.Dup()
        self.rank = self.comm.rank
        self.size = self.comm.size
        self.timeout = timeout
        self.cuda_aware = cuda_aware
        self.eager = eager
        self.via = via
        self.inline_limit = INLINE_LIMIT
        self.max_chunk = MAX_CHUNK
        upper = self.comm.Get_attr(MPI.TAG_UB)
        upper = int(upper) if upper is not None else 32767
        # The largest tag carries mnpar's own control messages (the wiring
        # check), fire and forget; users get every tag below it.
        self.control_tag = upper
        self.tag_ub = upper - 1
        # What must outlive this object: the communicator, sends in flight (changed
        # in place only), control messages set aside, peers' end notices; a transport
        # garbage-collected without ``free`` leaves it open until exit (``_ending``).
        self.line = Line(self.comm, self.control_tag, timeout, via)
        weakref.finalize(self, drop, self.line)
        self._pending = self.line.pending  # (request, buffer, dest, tag)
        self._held_control = self.line.held  # taken by recv_obj's any tag
        self._status = MPI.Status()
        # Every message starts with one MPI message of at most this size: an
        # inline message, or the header of a large one (``inline_limit`` may be
        # lowered, never raised).
        self._rbuf = np.empty(INLINE_LIMIT, np.uint8)
        self._reader = message.Reader(self._rbuf)
        # One persistent receive into ``_rbuf`` per (source, tag): ``Start`` skips the
        # buffer parsing ``Irecv`` does on every message (a third of a microsecond).
        self._first: Dict[Tuple[int, int], MPI.Prequest] = self.line.first
        # The size of the last large message per (source, tag): the wait for the next
        # one spins that much longer (``_arrive``), its sender being busy moving such data.
        self._last_nbytes: Dict[Tuple[int, int], int] = {}
        self._init_repeats()  # a payload that may come without its header (``_repeats``)

    def describe(self, op: str, peer: Optional[int], tag: Optional[int], what: Any,
                 watch: Optional[int] = None) -> Waiting:
        """What a wait of ``op`` waits for: its timeout text (``describe(elapsed)``), and
        whether ``peer`` (or ``watch``; every rank: None) has ended (``PeerFinished``)."""
        return Waiting(self.line, op, peer, tag, what, watch=watch)

    # -- arrays: the one send path and the one receive path ---------------------
    # ``send`` and ``recv`` check their own arguments (``Communicator``'s are a line
    # each): a repeat's route, checked when it was noted, skips the check. The
    # other entry points are validated once, by the public layer that calls them
    # (``functions.send``, ...), not again here.

    def send(self, data: Any, dest: Any, tag: Any) -> None:
        """Checks ``dest`` and ``tag`` (``check_route``) and sends an array or a
        tuple/list of arrays to ``dest`` (``send_message``).

        A repeat (``_repeats``) is known before anything else: its route is in
        ``_sent``, so ``dest`` and ``tag`` were checked when it was noted (exact
        ints only: a bool or NumPy integer equal to one goes the long way), and
        its payload is posted without another call. Any other host array gets
        ``check_route``'s test inline. After a large receive a rank's caches
        are cold, and each call and test on the way to the next ``Isend``
        costs several times its usual time (docs/benchmarks.rst).
        """
        if type(data) is np.ndarray and type(dest) is int and type(tag) is int:
            sent = self._sent.get((dest, tag))
            if (sent is not None and sent[0] == (data.dtype, data.shape, 0)
                    and data.flags.c_contiguous and not self.eager
                    and sent[1] <= self.max_chunk):
                req = self.comm.Isend([data, BYTE], dest, tag)  # a repeat: the payload alone
                if not settled([req]):
                    self._wait_sent([req], dest, tag, sent[1])
                return
            if not (0 <= dest < self.size and dest != self.rank and 0 <= tag <= self.tag_ub):
                self.check_route(dest, tag, "dest")  # (``check_route``'s own test failed: raises)
            nbytes = data.nbytes  # one host array, the common message: no list, no Message
            if nbytes <= self.inline_limit - message.MAX_HEADER_ONE:  # small: inline, any ndim
                self._post(message.pack_one(data, message.INLINE), dest, tag)
            elif self.inline_limit <= nbytes <= self.max_chunk and not self.eager:
                self._send_host_framed(data, 0, dest, tag)  # large: ``_send_one``'s verdict
            else:
                self._send_one(data, 0, dest, tag)
            return
        dest, tag = self.check_route(dest, tag, "dest")
        if type(data) is np.ndarray:  # (a NumPy integer rank or tag)
            self._send_one(data, 0, dest, tag)
            return
        arrays, is_tuple = as_array_list(data)
        self.send_message(message.Message(arrays, message.TUPLE if is_tuple else 0), dest, tag)

    def send_message(self, msg: message.Message, dest: int, tag: int) -> None:
        """Sends ``msg`` (its arrays all NumPy or all cupy, None where absent) to ``dest``.

        Each message is framed once, by the codec's rule (``message.fits_inline``):
        a small message is one ``Isend`` that never waits; a large one is its
        header and its arrays' memory (``_send_framed``).
        """
        arrays, flags = msg
        if len(arrays) == 1 and type(arrays[0]) is np.ndarray and not flags & message.TUPLE:
            self._send_one(arrays[0], flags, dest, tag)
            return
        if not message.fits_inline(arrays, self.inline_limit):
            self._send_framed(arrays, flags, dest, tag)
            return
        # A small GPU message goes through the host even where MPI is CUDA-aware:
        # one message that never waits beats a payload the receiver must post.
        arrays, gpu = message.to_wire(arrays)
        flags |= gpu | message.INLINE
        self._post(message.pack(message.encode(arrays, flags), arrays), dest, tag)

    def _send_one(self, a: np.ndarray, flags: int, dest: int, tag: int) -> None:
        """One host array, the common message: the same rule, without the lists (and
        without a call where the size alone decides)."""
        nbytes, limit = a.nbytes, self.inline_limit
        if nbytes <= limit - message.MAX_HEADER_ONE or (
                nbytes < limit and message.fits_inline_one(a, limit)):
            self._post(message.pack_one(a, message.INLINE | flags), dest, tag)
        elif nbytes <= self.max_chunk and not self.eager:
            self._send_host_framed(a, flags, dest, tag)
        else:
            self._send_framed([a], flags, dest, tag)

    def _send_framed(self, arrays: List[Any], flags: int, dest: int, tag: int) -> None:
        """A large message: its header, then each array's own memory in chunks of at
        most ``max_chunk`` bytes. It waits until ``dest`` has received it (MPI's
        standard mode), except on an ``eager`` transport, which copies the arrays
        and keeps the sends (``_post``) until they complete."""
        arrays, gpu = message.to_wire(arrays, self.cuda_aware and not self.eager)
        flags |= gpu
        one = len(arrays) == 1 and not gpu and arrays[0] is not None
        header = message.encode_one(arrays[0], flags) if one else message.encode(arrays, flags)
        if len(header) > self._rbuf.size:
            raise ValueError(f"a message of {len(arrays)} arrays needs a {len(header)}-byte "
                             f"header, over the {self._rbuf.size}-byte limit; send fewer "
                             "arrays per message")
        nbytes = sum(a.nbytes for a in arrays if a is not None)
        repeat = one and self._repeat(arrays[0], flags, dest, tag)
        if self.eager:  # the caller may change its arrays as soon as this returns
            if not repeat:
                self._post(header, dest, tag)
            for a in arrays:
                if a is not None:
                    for chunk in self._pieces(copied(a)):
                        self._post(message.flat_bytes(chunk), dest, tag)
            return
        isend = self.comm.Isend
        reqs = [] if repeat else [isend([header, MPI.BYTE], dest, tag)]  # first, before any copy
        chunks = [chunk for a in arrays if a is not None for chunk in self._pieces(a)]
        if gpu and chunks:
            sync_device(chunks[-1])  # GPU memory handed to MPI (cuda_aware)
        reqs += [isend([chunk, MPI.BYTE], dest, tag) for chunk in chunks]
        if not settled(reqs):
            self._wait_sent(reqs, dest, tag, nbytes)

    def _send_host_framed(self, a: np.ndarray, flags: int, dest: int, tag: int) -> None:
        """``_send_framed`` of one host array in one piece, without the lists: its
        header leaves first, before any check, unless ``dest`` knows it (a repeat)."""
        reqs = ([] if self._repeat(a, flags, dest, tag)
                else [self.comm.Isend([message.encode_one(a, flags), MPI.BYTE], dest, tag)])
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)  # the same message, C-ordered
        reqs.append(self.comm.Isend([a, MPI.BYTE], dest, tag))
        if not settled(reqs):
            self._wait_sent(reqs, dest, tag, a.nbytes)

    def _wait_sent(self, reqs: List[MPI.Request], dest: int, tag: int, nbytes: int) -> None:
        """The rest of a send's wait, once ``settled(reqs)`` said no: meanwhile the
        memory for ``dest``'s next repeat on ``tag`` is made (``_prepare_next``)."""
        if self._known:
            self._prepare_next(dest, tag)
        keep_waiting(reqs, self.timeout, self.describe(
            "send", dest, tag, f"rank {dest} to receive {nbytes} bytes"), nbytes=nbytes)

    def recv(self, source: Any, tag: Any) -> Any:
        """Checks ``source`` and ``tag`` (``check_route``) and receives what ``send``
        sent: an array, or a tuple of arrays. A route with a known header was
        checked when it was learnt (``send``'s rule): its receive is posted first."""
        known = (self._known.get((source, tag))
                 if self._known and type(source) is int and type(tag) is int else None)
        if known is not None and known.nbytes <= self.max_chunk:  # ``_arrive``, inlined
            header, inline = self._arrive_known(known, source, tag)
            if header is None:  # a repeat: the payload came alone (``_repeats``)
                return inline
        else:
            source, tag = self.check_route(source, tag, "source")
            header, inline = self._arrive(source, tag)
        if inline is not None:
            return inline.copy()  # the common message: no list, no Message
        if header.one_host and header.nbytes <= self.max_chunk:
            return self._recv_one(header, source, tag)  # the header's own verdict, no list
        arrays = self._arrays(header, source, tag)
        return tuple(arrays) if header.flags & message.TUPLE else arrays[0]

    def recv_message(self, source: int, tag: int) -> message.Message:
        """The next message from ``source`` with ``tag``: its arrays (None where one is
        absent) and its flags (``message.TUPLE``, ``message.GRADIENT``)."""
        header, inline = self._arrive(source, tag)
        if inline is not None:
            return message.Message([inline.copy()], header.flags)
        return message.Message(self._arrays(header, source, tag), header.flags)

    def _arrays(self, header: message.Header, source: int, tag: int) -> List[Any]:
        """The arrays of a message whose header ``_arrive`` returned (all but the
        common inline one): the one place that knows how each frame arrives. An
        error report raises its ``MessageMismatchError`` here."""
        if header.one_host and header.nbytes <= self.max_chunk:
            return [self._recv_one(header, source, tag)]  # one large host array
        if header.flags & message.INLINE:
            # The receive buffer is reused: the arrays get one copy of their own.
            count = self._status.Get_count(MPI.BYTE)
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

    def _arrive(self, source: int, tag: int) -> Tuple[message.Header, Optional[np.ndarray]]:
        """Waits for the first MPI message of the next message into ``_rbuf``; what
        ``Reader.read`` makes of it (on a route with a repeatable header: ``_repeats``)."""
        route = (source, tag)
        known = self._known.get(route) if self._known else None  # (none: small messages only)
        if known is not None and known.nbytes <= self.max_chunk:  # (a test may lower it)
            header, a = self._arrive_known(known, source, tag)
            if header is None:  # a repeat: its array waits in ``_early`` (``_recv_one``)
                self._early = a
                return known, None
            return header, a
        req = self._first.get(route) or self._first_request(source, tag)  # (never null)
        req.Start()
        if not (req.Test(self._status) or settled([req], self._status)):
            try:
                keep_waiting([req], self.timeout, self.describe(
                    "recv", source, tag, f"a message from rank {source}"), self._status,
                    likely=self._last_nbytes.get((source, tag), 0))
            except BaseException:  # cancelled: freed, never started again
                del self._first[(source, tag)]
                req.Free()
                raise
        header, inline = self._reader.read()
        if inline is None:
            self._learn(header, source, tag)
        return header, inline

    def _recv_one(self, header: message.Header, source: int, tag: int) -> np.ndarray:
        """The one large host array (in one chunk) whose header ``_arrive`` returned.

        Its receive is posted at once: the sender's payload waits for it.
        """
        early = self._early
        if early is not None:  # a repeat: the payload came alone (``recv_message``'s way)
            self._early = None
            return early
        dtype, shape = header.specs[0]
        nbytes = self._last_nbytes[(source, tag)] = header.nbytes
        a = self._memory_for(dtype, shape, nbytes)
        payload = [self.comm.Irecv([a, MPI.BYTE], source, tag)]
        if not settled(payload):
            self._wait_payload(payload, source, tag, nbytes)
        return a

    def _first_request(self, source: int, tag: int) -> MPI.Prequest:
        if len(self._first) >= MAX_FIRST:
            self._free_first()
        req = self._first[(source, tag)] = self.comm.Recv_init([self._rbuf, MPI.BYTE], source, tag)
        return req

    def _free_first(self) -> None:
        self.line.free_requests()
        self._last_nbytes.clear()

    def _recv_payload(self, header, source: int, tag: int, direct: bool) -> List[Any]:
        self._last_nbytes[(source, tag)] = header.nbytes
        if not direct:
            arrays = message.host_buffers(header.specs, header.flags)
        else:
            cp = cupy_module()
            arrays = [None if dtype is None else cp.empty(shape, dtype)
                      for dtype, shape in header.specs]
            # The pool may hand back memory that queued kernels still use; MPI
            # writes it without waiting for them.
            cp.cuda.get_current_stream().synchronize()
        reqs = [self.comm.Irecv([chunk, MPI.BYTE], source, tag) for a in arrays
                if a is not None for chunk in self._pieces(a)]
        if not settled(reqs):
            self._wait_payload(reqs, source, tag, header.nbytes)
        return arrays

    def _wait_payload(self, reqs: List[MPI.Request], source: int, tag: int,
                      nbytes: int) -> None:
        """The rest of a payload's wait, once ``settled(reqs)`` said no."""
        keep_waiting(reqs, self.timeout, self.describe(
            "recv", source, tag, f"{nbytes} bytes of payload from rank {source}"), nbytes=nbytes)

    def _pieces(self, a: Any) -> List[Any]:
        """``a``'s memory as the MPI messages it travels in: itself (C-ordered), or flat
        chunks of at most ``max_chunk`` bytes, so that counts stay within MPI's
        ``int``. An empty array is one empty message: sender and receiver count
        one message per array whatever path they take."""
        if a.nbytes <= self.max_chunk:
            return [a if a.flags.c_contiguous else message.flat_bytes(a)]
        view, step = message.flat_bytes(a), self.max_chunk
        return [view[i: i + step] for i in range(0, view.size, step)]

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
        self._held_control.clear()  # announcements for models this rank is not in
        self.flush()
        self._free_first()
        self._ready = None  # memory made for a repeat that will not come
        self.line.close()
        self.comm.Free()
