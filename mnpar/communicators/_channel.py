"""The pipeline's channel: sends that never wait, buffers freed as they complete.

An eager send (``Transport(eager=True)``) copies a large message's arrays
and posts the copy like a small message, so the caller may reuse its arrays
at once; the copy must live until MPI has sent it. Kept until the step's
``flush``, the copies of all K micro-batches' activations and gradients
would be held at once, and a step's memory would grow with K. So every
send (before it posts) and every receive (once done) tests the sends in
flight, one ``Testsome`` of about 2 us, and drops those that have completed:
a copy lives about as long as its receiver takes to receive it.

==================================  =========================================
the receiver takes each message     copies the sender holds at most
==================================  =========================================
before the next one is sent         one (two where the last one's completion
                                    has not reached the sender yet)
only once all K have been sent      all K, each until it has been received
==================================  =========================================

The subclass keeps the cost out of ``Transport``'s own sends: only the
channel tests and counts. ``pending_bytes`` and ``peak_pending_bytes`` report
the copies held (pickled objects are not counted).
"""
from typing import Any, Optional

from mpi4py import MPI

from ._message import Message
from ._transport import Transport


class Channel(Transport):
    """A transport whose sends never wait for their receiver; see the module docstring.

    Args:
        mpi_comm: the communicator to duplicate (mnpar's private one).
        timeout: seconds any wait may last, or None for no limit.
        cuda_aware: whether MPI can read and write GPU memory directly.
        via: how error texts name this channel's traffic (" through the pipeline").

    Attributes:
        peak_pending_bytes: the most ``pending_bytes`` has been since
            ``reset_peak`` (or since the channel was made).
    """

    def __init__(self, mpi_comm: MPI.Comm, timeout: Optional[float] = None,
                 cuda_aware: bool = False, via: str = "") -> None:
        super().__init__(mpi_comm, timeout, cuda_aware, eager=True, via=via)
        self._held = 0
        self.peak_pending_bytes = 0

    def pending_bytes(self) -> int:
        """Bytes of send buffers not yet released: sends not seen complete."""
        return self._held

    def reset_peak(self) -> None:
        """Starts ``peak_pending_bytes`` again from the bytes held now."""
        self.peak_pending_bytes = self._held

    def progress(self) -> None:
        """Lets MPI move the sends in flight and releases the completed ones.

        A large message goes by rendezvous: MPI moves it only while the
        sender is inside an MPI call, so a rank computing for long between
        calls keeps its receiver waiting. The pipeline calls this between
        the function nodes of every action (one ``Testsome``, ~2 us, and
        nothing when no send is in flight).
        """
        self._reap()

    def _post(self, buf: Any, dest: int, tag: int) -> None:
        """Starts a send of ``buf`` (bytes or a flat uint8 array) after releasing
        the completed ones."""
        self._reap()
        self._pending.append((self.comm.Isend([buf, MPI.BYTE], dest, tag), buf, dest, tag))
        self._held += len(buf)
        if self._held > self.peak_pending_bytes:
            self.peak_pending_bytes = self._held

    def _reap(self) -> None:
        """Drops every send in flight that has completed, buffer and request."""
        pending = self._pending
        if pending and MPI.Request.Testsome([p[0] for p in pending]):
            # Testsome sets each completed request to MPI.REQUEST_NULL, which is false.
            self._held -= sum(len(p[1]) for p in pending if not p[0] and p[1] is not None)
            pending[:] = [p for p in pending if p[0]]

    def recv(self, source: int, tag: int) -> Any:
        got = super().recv(source, tag)
        self._reap()
        return got

    def recv_message(self, source: int, tag: int) -> Message:
        got = super().recv_message(source, tag)
        self._reap()
        return got

    def flush(self) -> None:
        super().flush()
        self._held = 0
