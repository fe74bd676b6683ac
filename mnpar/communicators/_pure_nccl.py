"""The ``pure_nccl`` strategy: one NCCL allreduce over every rank's GPU.

See ``_reducers`` for what the strategies share and how they compare.
"""
from typing import List, Optional

from numpy.typing import DTypeLike

from .._arrays import is_cupy_array
from ._nccl import (
    NcclGroup,
    check_same_device,
    check_wire_dtype,
    gradient_device,
    require_nccl,
    shared_gpus,
)
from ._reducers import FlatReducer, Param, PendingMean
from ._topology import Topology
from ._transport import Transport


class PureNcclReducer(FlatReducer):
    """One NCCL allreduce over all ranks, gradients packed on the GPU.

    ``allreduce_grad_dtype`` (e.g. float16) sets the dtype on the wire. The
    NCCL communicator is made at the first reduction (``_nccl``). Starting
    launches the allreduce on the current stream, behind which every later
    kernel queues, so ``finish`` has nothing to wait for: under double
    buffering the GPU still runs it between two steps' kernels, not beside them.
    """

    def __init__(self, transport: Transport, topology: Topology,
                 allreduce_grad_dtype: DTypeLike = None) -> None:
        super().__init__(transport, topology)
        self._wire = check_wire_dtype(allreduce_grad_dtype)
        self._nccl: Optional[NcclGroup] = None

    @staticmethod
    def check_config(allreduce_grad_dtype: DTypeLike) -> None:
        """``TypeError`` for a wire dtype NCCL cannot sum; ``RuntimeError`` without NCCL."""
        check_wire_dtype(allreduce_grad_dtype)
        require_nccl()

    def set_wire_dtype(self, allreduce_grad_dtype: DTypeLike) -> None:
        """Changes the dtype on the wire from the next reduction on (``TypeError`` if NCCL
        cannot sum it)."""
        self._wire = check_wire_dtype(allreduce_grad_dtype)

    def _start_group(self, group: List[Param], pending: PendingMean) -> None:
        if not all(is_cupy_array(p.grad) for p in group):
            raise TypeError("pure_nccl reduces GPU gradients only; move the model to the "
                            "GPU (model.to_device(...)) or use the 'flat' communicator")
        nccl = self.nccl_group(gradient_device([p.grad for p in group]))
        buf, views = self._pack(group, False, self._wire or group[0].grad.dtype, pending)
        nccl.allreduce(buf)
        pending.add([], 0, group, views)

    def nccl_group(self, device: int) -> NcclGroup:
        """The NCCL communicator of every rank, made on ``device`` at the first call
        (collective); ``nccl_sum`` uses it too."""
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
