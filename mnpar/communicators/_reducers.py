"""Gradient averaging strategies: how each named communicator reduces grads.

The named communicators share one transport and differ only here:

================  ==========================================================
``naive``         one allreduce per parameter, in place
``flat``          every gradient of a dtype packed into one buffer, one allreduce
``hierarchical``  through shared memory inside each node (``_shared_memory``),
                  then one allreduce among node leaders
``pure_nccl``     packed on the GPU; one NCCL allreduce over all ranks
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

from .._arrays import cupy_module, get_array_module, is_cupy_array
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
            p.grad = get_array_module(p.data).zeros_like(p.data)
        out.append(p)
    return out


def _reduce_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == np.float16 else dtype


class GradReducer:
    """Averages the gradients of ``params`` over every rank of ``transport``."""

    name = ""

    def __init__(self, transport: Transport, topology: Any,
                 allreduce_grad_dtype: Optional[Any] = None) -> None:
        self.t = transport
        self.topology = topology
        self._buffers: Dict[Tuple, Any] = {}

    def mean_grad(self, params: List[Any]) -> None:
        for group in _by_dtype(params).values():
            self._mean_group(group)

    def _mean_group(self, group: List[Any]) -> None:
        buf, views = self._pack(group)
        self._allreduce_packed(buf)
        self._unpack(group, buf, views)

    def _pack(self, group: List[Any]):
        """Copies ``grad / size`` of every parameter into one buffer."""
        xp = get_array_module(group[0].grad)
        on_host = xp is np or not self.t.cuda_aware
        dtype = _reduce_dtype(group[0].grad.dtype)
        key = (dtype, on_host, tuple((id(p), p.grad.shape) for p in group))
        if key not in self._buffers:
            self._buffers = {}  # only the current layout is kept
            total = sum(p.grad.size for p in group)
            self._buffers[key] = (np if on_host else xp).empty(total, dtype)
        buf = self._buffers[key]
        inv = 1.0 / self.t.size
        views, offset = [], 0
        for p in group:
            n = p.grad.size
            view = buf[offset: offset + n].reshape(p.grad.shape)
            g = p.grad.get() if on_host and xp is not np else p.grad
            (np if on_host else xp).multiply(g, inv, out=view, casting="unsafe")
            views.append(view)
            offset += n
        return buf, views

    def _unpack(self, group, buf, views) -> None:
        for p, view in zip(group, views):
            if view.dtype != p.grad.dtype or is_cupy_array(p.grad) != is_cupy_array(view):
                xp = get_array_module(p.grad)
                p.grad = xp.asarray(view).astype(p.grad.dtype)
            else:
                p.grad = view

    def _allreduce_packed(self, buf) -> None:
        self._iallreduce(self.t.comm, buf, "multi_node_mean_grad")

    def free(self) -> None:
        """Releases what the strategy holds (collective where it shares memory)."""

    def _iallreduce(self, comm: MPI.Comm, buf, op: str) -> None:
        wait([comm.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM)], self.t.timeout,
             self.t.describe(op, None, None, "every rank's gradients"), nbytes=buf.nbytes)


class NaiveReducer(GradReducer):
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


class FlatReducer(GradReducer):
    """One allreduce over every gradient packed in one buffer."""

    name = "flat"


class HierarchicalReducer(GradReducer):
    """Sum inside each node through shared memory, then allreduce among nodes.

    Inside the node the ranks share one buffer (``_shared_memory``); between
    nodes only the node leaders talk, one allreduce of the node's sum.
    """

    name = "hierarchical"

    def __init__(self, transport: Transport, topology: Any,
                 allreduce_grad_dtype: Optional[Any] = None) -> None:
        super().__init__(transport, topology, allreduce_grad_dtype)
        self._nodes: Dict[np.dtype, NodeBuffer] = {}
        self._viewing: Dict[np.dtype, List[Any]] = {}  # parameters whose grads view a node

    def _mean_group(self, group: List[Any]) -> None:
        if self.topology.intra.size == 1:
            return super()._mean_group(group)  # a node of one: leaders allreduce
        dtype = _reduce_dtype(group[0].grad.dtype)
        node = self._node_buffer(dtype, sum(p.grad.size for p in group))
        previous = self._viewing.get(dtype, [])
        if [(id(p), p.shape) for p in previous] != [(id(p), p.shape) for p in group]:
            self._detach(node, previous)  # a new layout must not write over live views
        inv, offset, own = 1.0 / self.t.size, 0, []
        block, mine = node.block, node.mine
        for p in group:
            g = (p.grad.get() if is_cupy_array(p.grad) else p.grad).reshape(-1)
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


class PureNcclReducer(GradReducer):
    """One NCCL allreduce over all ranks, gradients packed on the GPU.

    ``allreduce_grad_dtype`` (e.g. float16) sets the dtype on the wire.
    """

    name = "pure_nccl"

    def __init__(self, transport: Transport, topology: Any,
                 allreduce_grad_dtype: Optional[Any] = None) -> None:
        super().__init__(transport, topology)
        cp = _require_nccl()
        from cupy.cuda import nccl

        uid = transport.comm.bcast(nccl.get_unique_id() if transport.rank == 0 else None)
        self._nccl = nccl.NcclCommunicator(transport.size, uid, transport.rank)
        self._cp = cp
        self._wire = None if allreduce_grad_dtype is None else np.dtype(allreduce_grad_dtype)

    def _mean_group(self, group: List[Any]) -> None:
        from cupy.cuda import nccl

        cp = self._cp
        if not all(is_cupy_array(p.grad) for p in group):
            raise TypeError("pure_nccl reduces GPU gradients only; move the model to the "
                            "GPU (model.to_device(...)) or use the 'flat' communicator")
        dtype = self._wire or group[0].grad.dtype
        buf = cp.concatenate([p.grad.ravel() for p in group]).astype(dtype, copy=False)
        buf *= 1.0 / self.t.size
        codes = {np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.float32): nccl.NCCL_FLOAT32,
                 np.dtype(np.float64): nccl.NCCL_FLOAT64}
        stream = cp.cuda.get_current_stream()
        self._nccl.allReduce(buf.data.ptr, buf.data.ptr, buf.size, codes[np.dtype(dtype)],
                             nccl.NCCL_SUM, stream.ptr)
        offset = 0
        for p in group:
            n = p.grad.size
            p.grad = buf[offset: offset + n].reshape(p.grad.shape).astype(p.grad.dtype)
            offset += n


def _require_nccl():
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("the 'pure_nccl' communicator needs cupy; install cupy-cudaXXx "
                           "or use 'flat' / 'hierarchical' on CPUs")
    try:
        from cupy.cuda import nccl  # noqa: F401

        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as e:
        raise RuntimeError(f"the 'pure_nccl' communicator needs NCCL and a CUDA device: {e}; "
                           "use 'flat' or 'hierarchical' instead") from e
    return cp


def _by_dtype(params: List[Any]) -> Dict[Tuple, List[Any]]:
    groups: Dict[Tuple, List[Any]] = {}
    for p in params:
        groups.setdefault((p.grad.dtype, is_cupy_array(p.grad)), []).append(p)
    return groups


REDUCERS = {cls.name: cls for cls in (NaiveReducer, FlatReducer, HierarchicalReducer,
                                      PureNcclReducer)}
