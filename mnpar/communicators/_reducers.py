"""Gradient averaging strategies: how each named communicator reduces grads.

The named communicators share one transport and differ only here:

================  ==========================================================
``naive``         one allreduce per parameter, in place
``flat``          every gradient of a dtype packed into one buffer, one allreduce
``hierarchical``  inside each node through shared memory (``_shared_memory``) or,
                  for GPUs, NCCL; then one allreduce among node leaders
``pure_nccl``     packed on the GPU; one NCCL allreduce over all ranks (``_nccl``)
================  ==========================================================

Packing scales by ``1/size`` in the same pass as the copy, and the reduced
buffer's views become the parameters' gradients, so a packed reduction costs
one copy plus the allreduce. A gradient array stays valid until the next
``multi_node_mean_grad`` on the same communicator; the parameters' gradients
themselves are always kept correct. A buffer is kept per layout (the parameters and
shapes it holds); a changed layout gets a new buffer, so gradients that are
still views of the old one are never overwritten.
"""
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .._arrays import device_of, get_array_module, is_cupy_array, sync_device, to_host
from ._nccl import (
    NcclGroup,
    check_same_device,
    check_wire_dtype,
    gradient_device,
    nccl_usable,
    require_nccl,
    shared_gpus,
)
from ._shared_memory import NodeBuffer
from ._transport import Transport
from ._wait import wait


def grads_to_reduce(params, zero_fill: bool) -> List[Any]:
    """The parameters whose gradients take part, in a rank-independent order.

    A parameter without data is skipped; one without a gradient is skipped,
    or with ``zero_fill`` given a zero gradient that takes part.
    """
    out = []
    for _, p in sorted(params, key=lambda item: item[0]):
        if p.data is None:
            continue
        if p.grad is None:
            if not zero_fill:
                continue
            with device_of(p.data):
                p.grad = get_array_module(p.data).zeros_like(p.data)
        out.append(p)
    return out


def _reduce_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == np.float16 else dtype


class FlatReducer:
    """One allreduce over every gradient packed in one buffer: the base strategy,
    which the others refine. Averages the gradients of ``params`` over every
    rank of ``transport``."""

    name = "flat"

    def __init__(self, transport: Transport, topology: Any,
                 allreduce_grad_dtype: Optional[Any] = None) -> None:
        self.t = transport
        self.topology = topology
        self._buffers: Dict[Tuple, Any] = {}

    @staticmethod
    def check_config(allreduce_grad_dtype: Any) -> None:
        """Raises, before any MPI call, where this strategy cannot run here."""

    def mean_grad(self, params: List[Any]) -> None:
        for group in _by_dtype(params).values():
            with device_of(group[0].grad):  # buffers and copies on the gradients' GPU
                self._mean_group(group)

    def _mean_group(self, group: List[Any]) -> None:
        on_host = not is_cupy_array(group[0].grad) or not self.t.cuda_aware
        buf, views = self._pack(group, on_host, _reduce_dtype(group[0].grad.dtype))
        sync_device(buf)  # on the GPU (cuda_aware), MPI reads it once packed
        self._allreduce_packed(buf)
        self._unpack(group, buf, views)

    def _pack(self, group: List[Any], on_host: bool, dtype: np.dtype):
        """Copies ``grad / size`` of every parameter into one buffer of ``dtype``.

        The buffer is on the host, or (``on_host`` False) on the current GPU,
        which ``mean_grad`` made the gradients' one.
        """
        xp = get_array_module(group[0].grad)
        bxp = np if on_host else xp
        key = (dtype, on_host, tuple((id(p), p.grad.shape) for p in group))
        if key not in self._buffers:
            self._buffers = {}  # only the current layout is kept
            total = sum(p.grad.size for p in group)
            self._buffers[key] = bxp.empty(total, dtype)
        buf = self._buffers[key]
        inv = 1.0 / self.t.size
        views, offset = [], 0
        for p in group:
            n = p.grad.size
            view = buf[offset: offset + n].reshape(p.grad.shape)
            g = p.grad.get() if on_host and xp is not np else p.grad
            bxp.multiply(g, inv, out=view, casting="unsafe")
            views.append(view)
            offset += n
        return buf, views

    def _unpack(self, group, buf, views) -> None:
        for p, view in zip(group, views):
            if view.dtype != p.grad.dtype or is_cupy_array(p.grad) != is_cupy_array(view):
                # cast where the view is, then at most one copy to the GPU
                p.grad = get_array_module(p.grad).asarray(view.astype(p.grad.dtype, copy=False))
            else:
                p.grad = view

    def _allreduce_packed(self, buf) -> None:
        self._iallreduce(self.t.comm, buf, "multi_node_mean_grad")

    def free(self) -> None:
        """Releases what the strategy holds (collective where it shares memory)."""

    def _iallreduce(self, comm: MPI.Comm, buf, op: str) -> None:
        """The sum over ``comm`` in place, waited for under the timeout.

        A GPU buffer (``cuda_aware``) takes a timed barrier and then a blocking
        ``Allreduce``: CUDA-aware MPIs (Open MPI's among them) reduce device
        memory in blocking collectives only.
        """
        describe = self.t.describe(op, None, None, "every rank's gradients")
        if is_cupy_array(buf):
            wait([comm.Ibarrier()], self.t.timeout, describe)
            comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM)
            return
        wait([comm.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM)], self.t.timeout, describe,
             nbytes=buf.nbytes)


class NaiveReducer(FlatReducer):
    """One in-place allreduce per parameter."""

    name = "naive"

    def _mean_group(self, group: List[Any]) -> None:
        inv = 1.0 / self.t.size
        for p in group:
            g = p.grad
            if isinstance(g, np.ndarray) and g.flags.c_contiguous and g.dtype != np.float16:
                self._iallreduce(self.t.comm, g, "multi_node_mean_grad")
                g *= inv
            else:  # float16, strided or staged GPU gradients go through a buffer
                super()._mean_group([p])


class HierarchicalReducer(FlatReducer):
    """Sum inside each node, allreduce among the node leaders, share inside the node.

    Inside the node, CPU gradients go through one shared-memory buffer
    (``_shared_memory``); GPU gradients through NCCL (reduce to the node's
    first rank, broadcast back) where every rank of the node has NCCL and a
    GPU of its own, else through the same host buffer. Between nodes only the
    node leaders talk: one MPI allreduce of the node's sum.
    """

    name = "hierarchical"

    def __init__(self, transport: Transport, topology: Any,
                 allreduce_grad_dtype: Optional[Any] = None) -> None:
        super().__init__(transport, topology, allreduce_grad_dtype)
        self._nodes: Dict[np.dtype, NodeBuffer] = {}
        self._viewing: Dict[np.dtype, List[Any]] = {}  # parameters whose grads view a node
        self._gpu: Optional[Any] = None  # the node's NcclGroup, or False: through the host
        self._gpu_device: Optional[int] = None

    def _mean_group(self, group: List[Any]) -> None:
        if self.topology.intra.size == 1:
            return super()._mean_group(group)  # a node of one: leaders allreduce
        if is_cupy_array(group[0].grad):
            nccl = self._node_nccl(gradient_device([p.grad for p in group]))
            if nccl:
                return self._mean_group_on_gpus(group, nccl)
        dtype = _reduce_dtype(group[0].grad.dtype)
        node = self._node_buffer(dtype, sum(p.grad.size for p in group))
        previous = self._viewing.get(dtype, [])
        if [(id(p), p.shape) for p in previous] != [(id(p), p.shape) for p in group]:
            self._detach(node, previous)  # a new layout must not write over live views
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
        if self.topology.inter_size > 1:
            if self.topology.leaders is not None:
                self._iallreduce(self.topology.leaders, node.mine, "multi_node_mean_grad")
            node.sync()
            if self.topology.intra.rank != 0:
                node.mine[...] = node.leader_row
            node.sync()  # the leader's row is rewritten by its next call
        views, offset = [], 0
        for p in group:
            views.append(node.mine[offset: offset + p.grad.size].reshape(p.grad.shape))
            offset += p.grad.size
        self._unpack(group, node.mine, views)
        self._viewing[dtype] = group

    def _node_nccl(self, device: int) -> Any:
        """The node's NCCL group on ``device``, or False: some rank lacks NCCL or shares a GPU.

        Decided together by the node's ranks at their first GPU reduction.
        """
        if self._gpu is None:
            intra = self.topology.intra
            wait([intra.Ibarrier()], self.t.timeout, self.t.describe(
                "multi_node_mean_grad", None, None, "the other ranks of this node"))
            usable = all(intra.allgather(nccl_usable()))
            if usable and shared_gpus(intra, device) is None:
                self._gpu = NcclGroup(intra, device)
            else:
                self._gpu = False
            self._gpu_device = device
        else:
            check_same_device(self._gpu_device, device)
        return self._gpu

    def _mean_group_on_gpus(self, group: List[Any], nccl: Any) -> None:
        """NCCL reduce to the node's first rank, MPI allreduce among leaders, NCCL broadcast."""
        buf, views = self._pack(group, False, _reduce_dtype(group[0].grad.dtype))
        nccl.reduce(buf)
        if self.topology.leaders is not None and self.topology.inter_size > 1:
            sync_device(buf)
            host = buf if self.t.cuda_aware else to_host(buf)
            self._iallreduce(self.topology.leaders, host, "multi_node_mean_grad")
            if host is not buf:
                buf.set(host)
        nccl.bcast(buf)
        self._unpack(group, buf, views)

    def _node_buffer(self, dtype: np.dtype, total: int) -> NodeBuffer:
        node = self._nodes.get(dtype)
        if node is None or node.total != total:
            if node is not None:
                self._release(dtype)
            node = self._nodes[dtype] = NodeBuffer(
                self.topology.intra, dtype, total, self.t.timeout,
                self.t.describe("multi_node_mean_grad", None, None,
                                "the other ranks of this node"))
        return node

    def _release(self, dtype: np.dtype) -> None:
        """Frees a node buffer after giving gradients that view it their own copy."""
        node = self._nodes.pop(dtype)
        self._detach(node, self._viewing.pop(dtype, []))
        node.free()

    @staticmethod
    def _detach(node: NodeBuffer, params: List[Any]) -> None:
        for p in params:
            if node.owns(p.grad):
                p.grad = p.grad.copy()

    def _allreduce_packed(self, buf) -> None:
        leaders = self.topology.leaders
        if leaders is not None and leaders.size > 1:
            self._iallreduce(leaders, buf, "multi_node_mean_grad")

    def free(self) -> None:
        for dtype in list(self._nodes):
            self._release(dtype)
        if self._gpu:
            self._gpu.free()
        self._gpu = None


class PureNcclReducer(FlatReducer):
    """One NCCL allreduce over all ranks, gradients packed on the GPU.

    ``allreduce_grad_dtype`` (e.g. float16) sets the dtype on the wire. The
    NCCL communicator is made at the first reduction (``_nccl``).
    """

    name = "pure_nccl"

    def __init__(self, transport: Transport, topology: Any,
                 allreduce_grad_dtype: Optional[Any] = None) -> None:
        super().__init__(transport, topology)
        self._wire = check_wire_dtype(allreduce_grad_dtype)
        self._nccl: Optional[NcclGroup] = None

    @staticmethod
    def check_config(allreduce_grad_dtype: Any) -> None:
        """``TypeError`` for a wire dtype NCCL cannot sum; ``RuntimeError`` without NCCL."""
        check_wire_dtype(allreduce_grad_dtype)
        require_nccl()

    def set_wire_dtype(self, allreduce_grad_dtype: Any) -> None:
        """Changes the dtype on the wire from the next reduction on (``TypeError`` if NCCL
        cannot sum it)."""
        self._wire = check_wire_dtype(allreduce_grad_dtype)

    def _mean_group(self, group: List[Any]) -> None:
        if not all(is_cupy_array(p.grad) for p in group):
            raise TypeError("pure_nccl reduces GPU gradients only; move the model to the "
                            "GPU (model.to_device(...)) or use the 'flat' communicator")
        nccl = self._group(gradient_device([p.grad for p in group]))
        buf, views = self._pack(group, False, self._wire or group[0].grad.dtype)
        nccl.allreduce(buf)
        self._unpack(group, buf, views)

    def _group(self, device: int) -> NcclGroup:
        """The NCCL communicator, made on ``device`` at the first call (collective)."""
        if self._nccl is None:
            self.t.arrive("multi_node_mean_grad")
            clashes = [c for c in self.t.comm.allgather(shared_gpus(self.topology.intra, device))
                       if c]
            if clashes:
                raise RuntimeError(
                    f"pure_nccl needs a GPU of its own for every rank, but {clashes[0]}. "
                    "Pick one per rank before the first multi_node_mean_grad, e.g. "
                    "chainer.cuda.get_device_from_id(comm.intra_rank).use() and "
                    "model.to_device(...)")
            self._nccl = NcclGroup(self.t.comm, device)
        else:
            check_same_device(self._nccl.device, device)
        return self._nccl

    def free(self) -> None:
        if self._nccl is not None:
            self._nccl.free()
            self._nccl = None


def _by_dtype(params: List[Any]) -> Dict[Tuple, List[Any]]:
    groups: Dict[Tuple, List[Any]] = {}
    for p in params:
        groups.setdefault((p.grad.dtype, is_cupy_array(p.grad)), []).append(p)
    return groups


REDUCERS = {cls.name: cls for cls in (NaiveReducer, FlatReducer, HierarchicalReducer,
                                      PureNcclReducer)}
