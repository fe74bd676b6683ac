"""Reduce-scatter and allgather of flat groups over the data axis.

Sharded data parallelism needs two collectives beyond the allreduce that the
communicator's strategies already make:

==================  ===================================  =================================
collective          on the host (MPI)                    on GPUs (NCCL, ``_nccl_shards``)
==================  ===================================  =================================
``reduce_scatter``  per column ``Ireduce_scatter`` with  per column ``reduceScatter``, each
                    every rank's own count, into the     rank's part padded to the column
                    shard, in place                      width
``allgather``       per column ``Iallgatherv`` in place  per column ``allGather`` into a
                    in the flat buffer (each rank's      staging buffer, then copied to
                    part already at its range)           each rank's range
==================  ===================================  =================================

Both go column by column (``_shards.FlatLayout.columns``) with a few columns
in flight, so no buffer is larger than ``IN_FLIGHT`` columns whatever the
model's size. Gradients are scaled by ``1 / size`` as they are packed, as
the ``flat`` and ``hierarchical`` strategies do, so at two ranks (where a sum
of two has one order) the shards equal plain data parallelism's means bit
for bit. float16 is reduced in float32, as the strategies do. Every wait
honours the communicator's timeout and names the collective.
"""
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
from mpi4py import MPI

from .._arrays import get_array_module
from ..communicators._facade import Communicator, wait
from ._shards import FlatLayout, column_width, copy_flat, reduce_dtype

IN_FLIGHT = 4  # columns posted before the oldest is waited for


class ShardCollectives:
    """The sharded collectives over ``comm`` (the data axis), host or GPU by the arrays.

    Args:
        comm: the mnpar communicator of the data-parallel ranks.
    """

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self._nccl: Any = None

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def rank(self) -> int:
        return self.comm.rank

    def reduce_scatter(self, arrays: Sequence[Optional[Any]], layout: FlatLayout, shard: Any,
                       accumulate: bool = False) -> None:
        """``shard`` (this rank's range, 1-D) becomes (``accumulate``: gains) the mean over
        the ranks of the group's ``arrays`` (one per slot; None counts as zeros)."""
        xp = get_array_module(shard)
        wire = reduce_dtype(shard.dtype)
        inv = 1.0 / self.size
        lo_me = layout.bounds[self.rank][0]
        if xp is not np:
            return self._gpu().reduce_scatter(arrays, layout, shard, accumulate, wire, inv)
        pending: List[Any] = []
        width = column_width(wire)
        for column in layout.columns(width):
            counts = [b - a for a, b in column]
            send = np.empty(sum(counts), wire)
            offset = 0
            for a, b in column:
                copy_flat(arrays, layout, a, b, send[offset: offset + b - a], inv)
                offset += b - a
            a_me, b_me = column[self.rank]
            dest = shard[a_me - lo_me: b_me - lo_me]
            direct = not accumulate and dest.dtype == wire
            recv = dest if direct else np.empty(b_me - a_me, wire)
            request = self.comm.private_comm.Ireduce_scatter(
                send, recv, counts, MPI.SUM)
            finish = _no_op if direct else _merge(recv, dest, accumulate)
            pending.append(([request], send.nbytes, finish))
            if len(pending) >= IN_FLIGHT:
                self._finish(pending.pop(0), "reduce_scatter")
        for item in pending:
            self._finish(item, "reduce_scatter")

    def allgather(self, flat: Any, layout: FlatLayout) -> None:
        """Every rank's range of ``flat`` (the whole group, 1-D) on every rank, in place;
        each rank's own range must be there already."""
        if get_array_module(flat) is not np:
            return self._gpu().allgather(flat, layout)
        width = column_width(flat.dtype)
        pending: List[Any] = []
        for column in layout.columns(width):
            counts = [b - a for a, b in column]
            displs = [a for a, _ in column]
            request = self.comm.private_comm.Iallgatherv(
                MPI.IN_PLACE, [flat, (counts, displs)])
            pending.append(([request], sum(counts) * flat.itemsize, _no_op))
            if len(pending) >= IN_FLIGHT:
                self._finish(pending.pop(0), "allgather")
        for item in pending:
            self._finish(item, "allgather")

    def start_allgather(self, flat: Any, layout: FlatLayout) -> "Started":
        """``allgather`` posted and not waited for (host arrays; on GPUs it is done on return,
        ordered on the stream): ``Started.finish`` completes it."""
        if get_array_module(flat) is not np:
            self.allgather(flat, layout)
            return Started(self, [], 0)
        requests = []
        for column in layout.columns(max(1, layout.largest_shard)):
            counts = [b - a for a, b in column]
            displs = [a for a, _ in column]
            requests.append(self.comm.private_comm.Iallgatherv(
                MPI.IN_PLACE, [flat, (counts, displs)]))
        return Started(self, requests, layout.total * flat.itemsize)

    def _finish(self, item: Any, op: str) -> None:
        requests, nbytes, finish = item
        wait(requests, self.comm.timeout, self.comm.describe(
            f"sharded {op}", None, None, "every rank of the data axis"), nbytes=nbytes)
        finish()

    def _gpu(self) -> Any:
        if self._nccl is None:
            from ._nccl_shards import NcclShards

            self._nccl = NcclShards(self.comm)
        return self._nccl

    def free(self) -> None:
        if self._nccl is not None:
            self._nccl.free()
            self._nccl = None


class Started:
    """A collective in flight: ``finish`` waits for it (under the communicator's timeout)."""

    def __init__(self, owner: ShardCollectives, requests: List[Any], nbytes: int) -> None:
        self.owner, self.requests, self.nbytes = owner, requests, nbytes

    def test(self) -> bool:
        return not self.requests or bool(MPI.Request.Testall(self.requests))

    def finish(self) -> None:
        if self.requests:
            self.owner._finish((self.requests, self.nbytes, _no_op), "allgather")
            self.requests = []


def _no_op() -> None:
    return None


def _merge(recv: Any, dest: Any, accumulate: bool) -> Callable[[], None]:
    """What makes a received column part of the shard: added, or cast into it."""
    def merge() -> None:
        if accumulate:
            dest[...] += recv.astype(dest.dtype, copy=False)
        else:
            dest[...] = recv
    return merge
