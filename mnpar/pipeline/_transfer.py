"""Non-blocking array messages for the pipeline, on a transport of its own.

``Communicator.send`` waits for the receiver when a message is large, so two
ranks that both send large activations before receiving would wait for each
other. A schedule is proven deadlock-free only for sends that never wait, so
the pipeline sends through an *eager* channel of the communicator: the same
wire codec, send path and receive path as ``Communicator.send``/``recv``,
but every send returns at once (a large message's arrays are copied first),
each copy is freed as soon as its send completes (every send and receive
checks), and ``finish`` waits for the rest once all receives are done.
``pending_bytes`` and ``peak_pending_bytes`` tell how much the copies held.
The channel is a duplicate of mnpar's private communicator, so the
pipeline's tags (one per edge, micro-batch and direction) never meet any
other traffic.
"""
from typing import Optional

from ..communicators import Communicator
from ..communicators._facade import Message, Transport

VIA = " through the pipeline"


class Transfer:
    """Sends and receives lists of arrays without ever blocking a send.

    Args:
        comm: an mnpar communicator; its channel is opened at once (collective).
    """

    def __init__(self, comm: Communicator) -> None:
        self._comm = comm
        self.rank = comm.rank
        self._channel: Optional[Transport] = comm.channel(VIA)

    def send(self, msg: Message, dest: int, tag: int) -> None:
        """Starts sending ``msg``'s arrays (NumPy or cupy, any dtype; None where one is
        absent) to ``dest``; never waits.

        GPU arrays are copied to the host (the send must not wait on MPI
        reading device memory) and land on the receiver's current GPU.
        """
        self._open().send_message(msg, dest, tag)

    def recv(self, source: int, tag: int) -> Message:
        """The message ``source`` sent with ``tag``.

        Arrays sent from a GPU arrive on this rank's current GPU.
        """
        return self._open().recv_message(source, tag)

    def progress(self) -> None:
        """Lets MPI move the sends in flight (``Transport.progress``: the eager outbox
        releases the copies of sends that completed); never waits."""
        if self._channel is not None:
            self._channel.progress()

    def finish(self) -> None:
        """Waits until every send started has been received; frees their buffers."""
        if self._channel is not None:
            self._channel.flush()

    def pending_bytes(self) -> int:
        """Bytes of send buffers not yet freed (sends not seen complete); 0 once freed."""
        return self._channel.pending_bytes() if self._channel is not None else 0

    @property
    def peak_pending_bytes(self) -> int:
        """The most ``pending_bytes`` has been since ``open`` or ``reset_peak``."""
        return self._channel.peak_pending_bytes if self._channel is not None else 0

    def reset_peak(self) -> None:
        """Starts ``peak_pending_bytes`` again from the bytes held now."""
        if self._channel is not None:
            self._channel.reset_peak()

    def open(self) -> None:
        """Starts a step: opens the channel again if ``free`` closed it
        (collective) and resets ``peak_pending_bytes``."""
        self._open().reset_peak()

    def free(self) -> None:
        """Completes the sends in flight and frees the channel (collective)."""
        if self._channel is not None:
            self._channel.free()
            self._channel = None

    def _open(self) -> Transport:
        if self._channel is None:
            self._channel = self._comm.channel(VIA)
        return self._channel
