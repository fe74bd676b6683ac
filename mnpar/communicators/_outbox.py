"""How a transport's sends are posted: the outbox strategies, standard and eager.

The framing (``Transport.send_arrays``) decides what goes on the wire: one
inline message, a header and the arrays' memory, or a payload alone. The
outbox decides how each MPI send is posted and how long it is kept:

=============  ===============================  ===================================
strategy       a small message (``post``)       a large one (``send_one``,
                                                ``send_payload``)
=============  ===============================  ===================================
``Outbox``     ``Isend``, kept until it         ``Isend`` from the arrays' own memory
(standard)     completes (forgotten in          (no copy); waits until the receiver
               batches of ``REAP_EVERY``; with  has it, as MPI's standard mode does;
               ``MAX_PENDING`` in flight, the   a GPU array may stay on the device
               next waits for the oldest)       (``cuda_aware``)
``Eager``      the same, after forgetting the   the arrays copied (the receive pool's
(the           completed sends; counts the      memory), the copies posted like small
pipeline's)    bytes it holds                   messages: never waits
=============  ===============================  ===================================

An eager send never waits for its receiver, which the pipeline's schedules
are proven deadlock-free for. Its copies must live until MPI has sent them;
kept until the step's ``flush``, the copies of all K micro-batches'
activations and gradients would be held at once, so every eager post (and
every receive, and ``progress``, which the pipeline calls between the
function nodes of every action) first drops the sends that have completed,
one ``Testsome`` (its cost: docs/benchmarks_history.rst): a copy lives about
as long as its receiver takes to take it.

==================================  =========================================
the receiver takes each message     copies the eager outbox holds at most
==================================  =========================================
before the next one is sent         one (two where the last one's completion
                                    has not reached the sender yet)
only once all K have been sent      all K, each until it has been received
==================================  =========================================

Sends in flight live in the transport's line (``_ending``), which outlives
a dropped transport, so that its sends still complete at exit.
"""
from typing import Any, List, Optional, Sequence, Union

import numpy as np
from mpi4py import MPI

from .._arrays import sync_device
from ._ending import Line, reap_dropped
from ._message import flat_bytes, pieces
from ._pool import copied
from ._wait import keep_waiting, settled, wait
from ._waiting import Waiting

REAP_EVERY = 16  # completed sends are forgotten in batches of this many
MAX_PENDING = 256  # small sends kept in flight before the oldest is waited for
BYTE = MPI.BYTE
Buffer = Union[bytes, np.ndarray]


class Outbox:
    """The standard outbox: small sends fire and forget, large ones from the arrays'
    own memory, waited for. See the module docstring.

    Args:
        line: the transport's line: its communicator, sends in flight and timeout.
    """

    keeps_device = True  # a large GPU message may be sent from device memory (cuda_aware)

    def __init__(self, line: Line) -> None:
        self.line = line
        self.comm = line.comm
        self.pending = line.pending  # (request, buffer, dest, tag), changed in place only
        self.peak_pending_bytes = 0  # counted by the eager outbox only

    def post(self, buf: Buffer, dest: int, tag: int) -> None:
        """Starts a small send of ``buf`` (bytes or a flat uint8 array); never waits."""
        pending = self.pending
        pending.append((self.comm.Isend([buf, BYTE], dest, tag), buf, dest, tag))
        if len(pending) >= REAP_EVERY:
            self.reap()

    def keep(self, req: MPI.Request, dest: int, tag: int) -> None:
        """Keeps a pickled object's send (mpi4py holds its buffer) until it completes."""
        self.pending.append((req, None, dest, tag))
        if len(self.pending) >= REAP_EVERY:
            self.reap()

    def send_one(self, header: Optional[bytes], a: np.ndarray, dest: int, tag: int) -> None:
        """A large message of one host array in one piece: its header (None: the
        receiver knows it, the payload goes alone), then ``a``'s own memory."""
        isend = self.comm.Isend
        reqs = [] if header is None else [isend([header, BYTE], dest, tag)]  # before a copy
        reqs.append(isend([a if a.flags.c_contiguous else np.ascontiguousarray(a), BYTE],
                          dest, tag))  # (a strided array: the same message, C-ordered)
        if not settled(reqs):
            self._wait_sent(reqs, dest, tag, a.nbytes)

    def send_payload(self, header: bytes, arrays: Sequence[Any], gpu: bool, dest: int, tag: int,
                     max_chunk: int) -> None:
        """A large message: its header, then each array's memory (NumPy, or cupy where
        ``gpu``) in pieces of at most ``max_chunk`` bytes (``message.pieces``)."""
        isend = self.comm.Isend
        reqs = [isend([header, BYTE], dest, tag)]  # first, before any copy
        chunks = [chunk for a in arrays if a is not None for chunk in pieces(a, max_chunk)]
        if gpu and chunks:
            sync_device(chunks[-1])  # GPU memory handed to MPI (cuda_aware)
        reqs += [isend([chunk, BYTE], dest, tag) for chunk in chunks]
        if not settled(reqs):
            self._wait_sent(reqs, dest, tag, sum(a.nbytes for a in arrays if a is not None))

    def _wait_sent(self, reqs: List[MPI.Request], dest: int, tag: int, nbytes: int) -> None:
        """The rest of a large send's wait, once ``settled(reqs)`` said no."""
        keep_waiting(reqs, self.line.timeout, Waiting(
            self.line, "send", dest, tag, f"rank {dest} to receive {nbytes} bytes"),
            nbytes=nbytes)

    def reap(self) -> None:
        """Forgets the completed sends; bounds how many stay in flight."""
        pending = self.pending
        if len(pending) >= MAX_PENDING:
            req, _, dest, tag = pending[0]
            wait([req], self.line.timeout, Waiting(
                self.line, "send", dest, tag, "the oldest of many small sends to be received"))
        pending[:] = [p for p in pending if not p[0].Test()]
        reap_dropped()

    def progress(self) -> None:
        """Lets MPI move the sends in flight and forgets the completed ones; never waits.

        A large message goes by rendezvous: MPI moves it only while the
        sender is inside an MPI call, so a rank computing for long between
        calls keeps its receiver waiting.
        """
        pending = self.pending
        if pending and MPI.Request.Testsome([p[0] for p in pending]):
            # Testsome sets each completed request to MPI.REQUEST_NULL, which is false.
            pending[:] = [p for p in pending if p[0]]

    def received(self) -> None:
        """Called once a message has been received: nothing to do here."""

    def pending_bytes(self) -> int:
        """Bytes of send buffers not yet released: sends not seen complete."""
        return sum(len(p[1]) for p in self.pending if p[1] is not None)

    def reset_peak(self) -> None:
        """Starts ``peak_pending_bytes`` again from the bytes held now."""
        self.peak_pending_bytes = self.pending_bytes()

    def flush(self) -> None:
        """Waits until every send in flight has been received."""
        if self.pending:
            wait([p[0] for p in self.pending], self.line.timeout, Waiting(
                self.line, "flush", None, None, "small sends in flight to be received"))
        self.pending.clear()


class Eager(Outbox):
    """The eager outbox: no send ever waits for its receiver; a large message's arrays
    are copied and posted like small messages (the module docstring)."""

    keeps_device = False  # a GPU array is copied to the host: the copy is the send's own

    def __init__(self, line: Line) -> None:
        super().__init__(line)
        self.held = 0  # bytes of the buffers in ``pending``

    def post(self, buf: Buffer, dest: int, tag: int) -> None:
        """Starts a send of ``buf`` after releasing the completed ones; counts its bytes."""
        self.progress()
        self.pending.append((self.comm.Isend([buf, BYTE], dest, tag), buf, dest, tag))
        self.held += len(buf)
        if self.held > self.peak_pending_bytes:
            self.peak_pending_bytes = self.held

    def send_one(self, header: Optional[bytes], a: np.ndarray, dest: int, tag: int) -> None:
        if header is not None:
            self.post(header, dest, tag)
        self.post(flat_bytes(copied(a)), dest, tag)  # the caller may change ``a`` at once

    def send_payload(self, header: bytes, arrays: Sequence[Any], gpu: bool, dest: int, tag: int,
                     max_chunk: int) -> None:
        self.post(header, dest, tag)
        for a in arrays:
            if a is not None:  # (host arrays: ``keeps_device`` is False)
                for chunk in pieces(copied(a), max_chunk):
                    self.post(flat_bytes(chunk), dest, tag)

    def reap(self) -> None:
        self.progress()

    def received(self) -> None:
        """Releases the sends that have completed: a receive is often what a peer
        sent once it had received this rank's message."""
        self.progress()

    def progress(self) -> None:
        pending = self.pending
        if pending and MPI.Request.Testsome([p[0] for p in pending]):
            self.held -= sum(len(p[1]) for p in pending if not p[0] and p[1] is not None)
            pending[:] = [p for p in pending if p[0]]

    def pending_bytes(self) -> int:
        return self.held

    def flush(self) -> None:
        super().flush()
        self.held = 0
