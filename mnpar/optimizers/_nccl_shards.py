"""The sharded collectives on GPUs: NCCL's reduceScatter and allGather.

NCCL moves the same count from every rank, so each column's part (at most
the column width ``c``, ``_shards``) is padded to ``c``::

    reduceScatter   send [part 0 | pad][part 1 | pad] ...  ->  recv [my part | pad]
    allGather       send [my part | pad]                   ->  staging [part 0 | pad][part 1 | pad]
                                                              -> each part copied to its range

The NCCL communicator spans the data axis' ranks, one GPU each, and is made
at the first sharded collective on the GPU that holds the arrays (as
``pure_nccl``'s, ``communicators/_nccl``). Every call is queued on the
current stream, so what reads the results queues behind them.
"""
from typing import Any, Optional, Sequence

import numpy as np
from mpi4py import MPI

from ..communicators._facade import Communicator
from ..communicators._facade import nccl as _nccl
from ._shards import FlatLayout, column_width, copy_flat


class NcclShards:
    """reduceScatter and allGather of flat groups over ``comm``'s ranks, one GPU each."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self._cp = _nccl.require_nccl()
        self._group: Any = None
        self._device: Optional[int] = None

    def _nccl(self, device: int) -> Any:
        if self._group is None:
            from cupy.cuda import nccl

            mpi = self.comm.private_comm
            clashes = [c for c in self.comm.allgather_obj(_shared(self.comm, device)) if c]
            if clashes:
                raise RuntimeError(f"sharded data parallelism on GPUs needs a GPU of its own for "
                                   f"every rank of the data axis, but {clashes[0]}")
            uid = mpi.bcast(nccl.get_unique_id() if mpi.rank == 0 else None, root=0)
            with self._cp.cuda.Device(device):
                self._group = nccl.NcclCommunicator(mpi.size, uid, mpi.rank)
            self._device = device
            self._codes = {np.dtype(n): getattr(nccl, f"NCCL_{n.upper()}")
                           for n in _nccl.NCCL_DTYPES}
            self._sum = nccl.NCCL_SUM
        else:
            _nccl.check_same_device(self._device, device)
        return self._group

    def reduce_scatter(self, arrays: Sequence[Optional[Any]], layout: FlatLayout, shard: Any,
                       accumulate: bool, wire: np.dtype, inv: float) -> None:
        cp = self._cp
        group = self._nccl(shard.device.id)
        rank, size = self.comm.rank, self.comm.size
        lo_me = layout.bounds[rank][0]
        width = column_width(wire)
        stream = cp.cuda.get_current_stream().ptr
        with shard.device:
            for column in layout.columns(width):
                c = max(b - a for a, b in column) or 1
                send = cp.zeros(size * c, wire)
                for r, (a, b) in enumerate(column):
                    copy_flat(arrays, layout, a, b, send[r * c: r * c + b - a], inv)
                recv = cp.empty(c, wire)
                group.reduceScatter(send.data.ptr, recv.data.ptr, c, self._codes[wire],
                                    self._sum, stream)
                a_me, b_me = column[rank]
                dest = shard[a_me - lo_me: b_me - lo_me]
                got = recv[: b_me - a_me].astype(dest.dtype, copy=False)
                if accumulate:
                    dest += got
                else:
                    dest[...] = got

    def allgather(self, flat: Any, layout: FlatLayout) -> None:
        cp = self._cp
        group = self._nccl(flat.device.id)
        rank, size = self.comm.rank, self.comm.size
        width = column_width(flat.dtype)
        stream = cp.cuda.get_current_stream().ptr
        code = self._codes[np.dtype(flat.dtype)]
        with flat.device:
            for column in layout.columns(width):
                c = max(b - a for a, b in column) or 1
                a_me, b_me = column[rank]
                send = cp.zeros(c, flat.dtype)
                send[: b_me - a_me] = flat[a_me: b_me]
                staging = cp.empty(size * c, flat.dtype)
                group.allGather(send.data.ptr, staging.data.ptr, c, code, stream)
                for r, (a, b) in enumerate(column):
                    if r != rank:
                        flat[a: b] = staging[r * c: r * c + b - a]

    def free(self) -> None:
        if self._group is not None:
            self._group.destroy()
            self._group = None


def _shared(comm: Communicator, device: int) -> Optional[str]:
    """Which ranks of this rank's node use ``device``'s GPU too, or None (collective)."""
    intra = comm.private_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return _nccl.shared_gpus(intra, device)
    finally:
        intra.Free()
