"""The ``hierarchical`` strategy: inside each node, then among the node leaders.

See ``_reducers`` for what the strategies share and how they compare.
"""
from typing import Any, List, Optional

import numpy as np
from mpi4py import MPI
from numpy.typing import DTypeLike

from .._arrays import is_cupy_array, sync_device, to_host
from ._nccl import NcclGroup, check_same_device, gradient_device, nccl_usable, shared_gpus
from ._reducers import FlatReducer, Param, PendingMean, _reduce_dtype
from ._shared_memory import NodePool
from ._topology import Topology
from ._transport import Transport
from ._wait import wait


class HierarchicalReducer(FlatReducer):
    """Sum inside each node, allreduce among the node leaders, share inside the node.

    Inside the node, CPU gradients go through one shared-memory buffer
    (``_shared_memory``); GPU gradients through NCCL (reduce to the node's
    first rank, broadcast back) where every rank of the node has NCCL and a
    GPU of its own, else through the same host buffer. Between nodes only the
    node leaders talk: one MPI allreduce of the node's sum.

    ``start_mean`` completes the phase inside the node and posts the leaders'
    allreduce; ``finish`` waits for it and copies the leader's row to the
    node's other ranks. Through NCCL, ``start_mean`` does it all (the
    broadcast needs the leaders' sum).
    """

    def __init__(self, transport: Transport, topology: Topology,
                 allreduce_grad_dtype: DTypeLike = None) -> None:
        super().__init__(transport, topology, allreduce_grad_dtype)
        self._pool = NodePool(topology.intra, transport.timeout, transport.describe(
            "multi_node_mean_grad", None, None, "the other ranks of this node"))
        self._gpu: Optional[NcclGroup] = None  # the node's NCCL group; None: the host's
        self._gpu_device: Optional[int] = None  # where it was decided (None: not yet)

    def _start_group(self, group: List[Param], pending: PendingMean) -> None:
        if self.topology.intra.size == 1:
            return super()._start_group(group, pending)  # a node of one: leaders allreduce
        if is_cupy_array(group[0].grad):
            nccl = self._node_nccl(gradient_device([p.grad for p in group]))
            if nccl is not None:
                return self._start_group_on_gpus(group, nccl, pending)
        node = self._pool.take(_reduce_dtype(group[0].grad.dtype), group, self._busy)
        self._hold(node, pending)
        inv, offset, own = 1.0 / self.t.size, 0, []
        block, mine = node.block, node.mine
        for p in group:
            g = to_host(p.grad).reshape(-1)
            end = offset + g.size
            if offset < block.stop and end > block.start:
                own.append((offset, g))  # this rank sums it straight from its gradient
            for lo, hi in ((offset, min(end, block.start)), (max(offset, block.stop), end)):
                if lo < hi:  # the others sum it: it goes into the shared row
                    np.multiply(g[lo - offset:hi - offset], inv, out=mine[lo:hi],
                                casting="unsafe")
            offset = end
        node.sync()
        node.reduce_block(own, inv)
        node.sync()
        requests: List[MPI.Request] = []
        across = self.topology.inter_size > 1
        if across and self.topology.leaders is not None:
            requests = self._post(self.topology.leaders, mine)
        views, offset = [], 0
        for p in group:
            views.append(mine[offset: offset + p.grad.size].reshape(p.grad.shape))
            offset += p.grad.size
        pending.add(requests, mine.nbytes, group, views,
                    node.take_leader_row if across else None)

    def _node_nccl(self, device: int) -> Optional[NcclGroup]:
        """The node's NCCL group on ``device``, or None: some rank lacks NCCL or shares a
        GPU, and the node sums through the host.

        Decided together by the node's ranks at their first GPU reduction.
        """
        if self._gpu_device is None:
            intra = self.topology.intra
            wait([intra.Ibarrier()], self.t.timeout, self.t.describe(
                "multi_node_mean_grad", None, None, "the other ranks of this node"))
            usable = all(intra.allgather(nccl_usable()))
            if usable and shared_gpus(intra, device) is None:
                self._gpu = NcclGroup(intra, device)
            self._gpu_device = device
        else:
            check_same_device(self._gpu_device, device)
        return self._gpu

    def _start_group_on_gpus(self, group: List[Param], nccl: NcclGroup,
                             pending: PendingMean) -> None:
        """NCCL reduce to the node's first rank, MPI allreduce among leaders, NCCL broadcast."""
        buf, views = self._pack(group, False, _reduce_dtype(group[0].grad.dtype), pending)
        nccl.reduce(buf)
        if self.topology.leaders is not None and self.topology.inter_size > 1:
            sync_device(buf)
            host = buf if self.t.cuda_aware else to_host(buf)
            self._allreduce(self.topology.leaders, host)
            if host is not buf:
                buf.set(host)
        nccl.bcast(buf)
        pending.add([], 0, group, views)

    def _post_packed(self, buf: Any) -> List[MPI.Request]:
        leaders = self.topology.leaders
        if leaders is not None and leaders.size > 1:
            return self._post(leaders, buf)
        return []

    def free(self) -> None:
        self._pool.free()
        if self._gpu is not None:
            self._gpu.free()
        self._gpu = self._gpu_device = None
