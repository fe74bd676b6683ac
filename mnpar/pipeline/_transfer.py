"""Non-blocking array messages for the pipeline, on its own MPI communicator.

``Communicator.send`` waits for the receiver when a message is large, so two
ranks that both send large activations before receiving would wait for each
other. A schedule is proven deadlock-free only for sends that never wait, so
the pipeline packs each message (mnpar's binary header and the arrays,
copied once, straight into the buffer) into one buffer, starts an ``Isend``
and returns; ``finish`` waits for
every send of the step once all receives are done. Messages travel on a
duplicate of mnpar's private communicator, so the pipeline's tags (one per
edge, micro-batch and direction) never meet any other traffic.
"""
from typing import Any, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .._arrays import cupy_module, is_cupy_array, to_host
from ..communicators import _message as message
from ..communicators._wait import probe, wait


def _pack(header: bytes, arrays: List[np.ndarray]) -> np.ndarray:
    """The header and the arrays' bytes, each padded, in one buffer: one copy per array.

    The layout of ``message.pack_inline``, whose ``tobytes`` and join copy twice.
    """
    sizes = [message.padded(a.nbytes) for a in arrays]
    blob = np.empty(len(header) + sum(sizes), np.uint8)
    blob[:len(header)] = np.frombuffer(header, np.uint8)
    offset = len(header)
    for a, size in zip(arrays, sizes):
        if a.nbytes:
            np.copyto(np.ndarray(a.shape, a.dtype, buffer=blob, offset=offset), a)
        blob[offset + a.nbytes:offset + size] = 0
        offset += size
    return blob


class Transfer:
    """Sends and receives lists of arrays without ever blocking a send.

    Args:
        comm: an mnpar communicator; its private MPI communicator is duplicated
            (collective).
    """

    def __init__(self, comm: Any) -> None:
        self._source: MPI.Comm = comm.private_comm
        self.comm: MPI.Comm = self._source.Dup()
        self.rank = self.comm.rank
        self.timeout: Optional[float] = comm.timeout
        self._sends: List[Tuple[MPI.Request, Any]] = []
        self._status = MPI.Status()

    def send(self, arrays: List[Any], dest: int, tag: int, is_tuple: bool = False) -> None:
        """Starts sending ``arrays`` (NumPy or cupy, any dtype) to ``dest``; never waits.

        GPU arrays are copied to the host (the send must not wait on MPI
        reading device memory) and land on the receiver's current GPU.
        """
        gpu = any(is_cupy_array(a) for a in arrays)
        arrays = [np.asarray(to_host(a)) for a in arrays]
        flags = message.INLINE | (message.TUPLE if is_tuple else 0) | (message.GPU if gpu else 0)
        header = message.encode(arrays, flags)
        blob = _pack(header, arrays)
        self._sends.append((self.comm.Isend([blob, MPI.BYTE], dest, tag), blob))

    def recv(self, source: int, tag: int) -> Tuple[List[Any], bool]:
        """The arrays ``source`` sent with ``tag``, and whether they were a tuple.

        Arrays sent from a GPU arrive on this rank's current GPU.
        """
        status = self._status
        msg = probe(lambda: self.comm.Improbe(source, tag, status), self.timeout,
                    self._describe("recv from", source, tag))
        blob = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        wait([msg.Irecv([blob, MPI.BYTE])], self.timeout,
             self._describe("recv from", source, tag), nbytes=blob.size)
        header = message.decode(blob)
        arrays = message.unpack_inline(blob, header)
        if header.flags & message.GPU:
            cp = cupy_module()
            if cp is None:
                raise RuntimeError(f"rank {self.rank}: rank {source} sent GPU arrays through the "
                                   "pipeline, but this rank has no cupy; put every stage on a GPU "
                                   "or every stage on the CPU")
            arrays = [cp.asarray(a) for a in arrays]
        return arrays, bool(header.flags & message.TUPLE)

    def finish(self) -> None:
        """Waits until every send started has been received."""
        if self._sends:
            wait([r for r, _ in self._sends], self.timeout,
                 self._describe("send", None, None))
        self._sends = []

    def open(self) -> None:
        """Duplicates the communicator again if ``free`` freed it (collective)."""
        if self.comm == MPI.COMM_NULL:
            self.comm = self._source.Dup()

    def free(self) -> None:
        """Completes the sends in flight and frees the communicator."""
        if self.comm != MPI.COMM_NULL:
            self.finish()
            self.comm.Free()

    def _describe(self, op: str, peer: Optional[int], tag: Optional[int]):
        def text(elapsed: float) -> str:
            who = f" rank {peer}, tag {tag}" if peer is not None else " (sends of this step)"
            return (f"rank {self.rank}: pipeline {op}{who} did not complete after "
                    f"{elapsed:.1f} s (timeout {self.timeout} s)")
        return text
