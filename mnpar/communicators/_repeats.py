"""Repeated arrays: a payload that comes without its header.

A large array message is its header, then the array's own memory. The
receiver can post the array's receive only once the header is read, and
at 256 KiB that second round (about 1.5 us of MPI and 1 us of Python on
the AMD EPYC VM) cost an eighth of raw MPI's bandwidth. A training step sends
arrays of the same dtype and shape on the same route again and again, so:

* Each side remembers, per route (peer and tag), the header of the last
  *repeatable* message on it: one host array (gradient or not) of more than
  ``FIRST_LIMIT`` bytes, sent in one piece. The sender notes each one it
  sends, the receiver each one it reads, in MPI's order, by the same rule
  (``message.repeatable``), so both know the same header.
* A sender whose array has that very header sends the payload alone.
* A receiver that knows a header for the route posts the receive of that
  array at once, into the array's own memory, before anything arrives. A
  message of exactly the header's size is the payload; any message the
  sender frames anew (an inline array, a header, an error report) has at
  most ``FIRST_LIMIT`` bytes, fewer than any repeatable payload, lands in
  the same memory and is read as usual.
* A pickled object (``send_obj``) that would have exactly that size gets
  one byte more (pickle ignores bytes after its end), so nothing else ever
  has the size of a repeat: an object received where an array is expected,
  or a repeat received where an object is, is still an error, never a
  silent misread.

``Transport`` inherits this (through ``PickledMessages``); its drain at
``finalize`` (``_ending``) reads ``known`` too.
"""
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .._errors import MessageMismatchError
from . import _message as message
from ._ending import Line, Waiting
from ._pool import MIN_BYTES as POOLED
from ._pool import empty
from ._routes import Routes
from ._wait import keep_waiting, settled

Route = Tuple[int, int]  # (peer, tag)
AN_OBJECT = "did it send an object (send_obj) that this rank receives with recv?"


def new_array(shape: Tuple[int, ...], dtype: Any, nbytes: int) -> np.ndarray:
    """Memory for a large array received: the receive pool's from 1 MiB up."""
    return np.empty(shape, dtype) if nbytes < POOLED else empty(shape, dtype)


class Repeats(Routes):
    """The routes' last repeatable headers, and the receive that expects one."""

    comm: MPI.Comm
    timeout: Optional[float]
    max_chunk: int
    line: Line
    _status: MPI.Status
    _rbuf: np.ndarray
    _reader: message.Reader

    if TYPE_CHECKING:  # what ``Transport`` provides
        def describe(self, op: str, peer: Optional[int], tag: Optional[int], what: Any,
                     watch: Optional[int] = None) -> Waiting: ...

    def _init_repeats(self) -> None:
        # The sender's side per (dest, tag): the last repeatable array's (dtype, shape,
        # flags), which decide its header (``message.encode_one`` keys on them too), and
        # its bytes.
        self._sent: Dict[Route, Tuple[Tuple[Any, Tuple[int, ...], int], int]] = {}
        # The receiver's side, per (source, tag): kept on the line for its drain.
        self._known: Dict[Route, message.Header] = self.line.known
        self._early: Optional[np.ndarray] = None  # a repeat's payload, already here
        self._spare: Optional[np.ndarray] = None  # memory posted for one, still unused
        # Memory made for a route's next repeat while a send waited (``_prepare_next``):
        # (route, the header it was made for, the array).
        self._ready: Optional[Tuple[Route, message.Header, np.ndarray]] = None
        self._abandoned: List[Tuple[MPI.Request, np.ndarray]] = []  # cancelled receives

    def _repeat(self, a: np.ndarray, flags: int, dest: int, tag: int) -> bool:
        """Notes the header of a one-host-array message framed for ``dest``; True when
        ``dest`` knows it already: the payload goes alone."""
        route = (dest, tag)
        key = (a.dtype, a.shape, flags)
        sent = self._sent.get(route)
        if sent is not None and sent[0] == key and sent[1] <= self.max_chunk:
            return True  # (only repeatable headers are noted; a test may lower max_chunk)
        if message.repeatable(flags, a.nbytes, self.max_chunk):
            self._sent[route] = (key, a.nbytes)
        return False

    def _learn(self, header: message.Header, source: int, tag: int) -> None:
        """Notes a header read from ``source`` if it is repeatable (the sender's rule)."""
        if message.repeatable_header(header, self.max_chunk):
            self._known[(source, tag)] = header

    def _pickled_size(self, dest: int, tag: int) -> Optional[int]:
        """The size no pickled object to ``dest`` may have: its route's repeat's."""
        sent = self._sent.get((dest, tag))
        return None if sent is None else sent[1]

    def _prepare_next(self, source: int, tag: int) -> None:
        """Makes the memory for the next repeat from ``source`` on ``tag``, if its header
        is known, for ``_arrive_known`` to take instead of allocating: a send waits
        for its receiver anyway, and a ping-pong's reply is that route's next message.
        Where the receiver's way to its ``Irecv`` is the longer one, that saves the
        ``np.empty`` (0.4 us a 256 KiB message in a bare mpi4py ping-pong on the AMD
        EPYC VM; 0 to 0.3 us in ``bench_p2p``, docs/benchmarks.rst). One array at
        most, for one route; the next call replaces it."""
        known = self._known.get((source, tag))
        if known is None or known.nbytes > self.max_chunk:
            return
        ready = self._ready
        if ready is not None and ready[1] is known and ready[0] == (source, tag):
            return
        dtype, shape = known.specs[0]
        try:
            self._ready = ((source, tag), known, new_array(shape, dtype, known.nbytes))
        except MemoryError:  # never fail a send in flight for an optional buffer
            self._ready = None

    def _arrive_known(self, known: message.Header, source: int,
                      tag: int) -> Tuple[Optional[message.Header], Optional[np.ndarray]]:
        """``_arrive`` on a route with a known header: the receive into that array is
        posted before anything arrives. A repeat returns ``(None, its array)``;
        anything else is read from ``_rbuf`` as usual: ``(header, inline array)``."""
        nbytes = known.nbytes
        ready = self._ready
        if ready is not None and ready[1] is known and ready[0] == (source, tag):
            a = ready[2]  # made while this rank's last send waited
            self._ready = None
        else:
            dtype, shape = known.specs[0]
            a = new_array(shape, dtype, nbytes)
        req = self.comm.Irecv([a, MPI.BYTE], source, tag)
        status = self._status
        try:
            if not settled([req], status):
                keep_waiting([req], self.timeout, self.describe(
                    "recv", source, tag, f"a message from rank {source}"), status,
                    nbytes=nbytes)
        except MPI.Exception as e:
            if e.Get_error_class() != MPI.ERR_TRUNCATE:
                raise
            raise MessageMismatchError(
                f"rank {self.rank}: rank {source} sent, on tag {tag}, a message of more "
                f"than {nbytes} bytes where an array or a message header was expected: "
                + AN_OBJECT) from None
        except BaseException:  # interrupted: MPI may still write ``a``, which stays
            if req != MPI.REQUEST_NULL:
                try:
                    req.Cancel()  # (a timeout's wait has cancelled it already)
                except MPI.Exception:
                    pass
            self._abandoned.append((req, a))
            raise
        count = status.Get_count()  # (in bytes)
        if count == nbytes:
            return None, a
        if count > self._rbuf.size:
            raise MessageMismatchError(
                f"rank {self.rank}: rank {source} sent, on tag {tag}, {count} bytes that "
                f"are neither the {nbytes}-byte array it sent last nor a message header: "
                + AN_OBJECT)
        self._rbuf[:count] = a.reshape(-1).view(np.uint8)[:count]
        header, inline = self._reader.read()
        if inline is None:
            self._learn(header, source, tag)
            if header.one_host and header.nbytes == nbytes:
                self._spare = a
        return header, inline

    def _memory_for(self, dtype: Any, shape: Tuple[int, ...], nbytes: int) -> np.ndarray:
        """Memory for the payload of a one-array message whose header ``_arrive`` read:
        that posted for a repeat where it fits, else new."""
        spare = self._spare
        if spare is not None:
            self._spare = None
            if spare.dtype == dtype and spare.shape == shape:
                return spare
        return new_array(shape, dtype, nbytes)
