"""NCCL through cupy: one GPU per rank, made when the gradients are first seen.

NCCL binds a communicator to the device that is current when it is made,
and takes one rank per device. ChainerMN's users create the communicator
first and then pick a device from it::

    comm = mnpar.create_communicator("pure_nccl")
    chainer.cuda.get_device_from_id(comm.intra_rank).use()

so an NCCL communicator made by ``create_communicator`` would put every rank
of a node on GPU 0. mnpar makes it at the first reduction instead, on the
device that holds the gradients, after checking that no two ranks of a node
share one (NCCL's own error for that names neither rank nor device).
"""
from typing import Any, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .._arrays import cupy_module


def require_nccl() -> Any:
    """The cupy module, or ``RuntimeError`` unless cupy, NCCL and a CUDA device are all here."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("the 'pure_nccl' communicator needs cupy; install cupy-cudaXXx "
                           "or use 'flat' / 'hierarchical' on CPUs")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
        from cupy.cuda import nccl  # without a device first: cupy warns if NCCL is missing

        if not getattr(nccl, "available", True):  # cupy imports, but libnccl did not load
            raise RuntimeError("cupy found no NCCL library (pip install nvidia-nccl-cu12)")
    except Exception as e:
        raise RuntimeError(f"the 'pure_nccl' communicator needs NCCL and a CUDA device: {e}; "
                           "use 'flat' or 'hierarchical' instead") from e
    return cp


def nccl_usable() -> bool:
    """Whether this rank could reduce through NCCL (cupy, NCCL and a device)."""
    try:
        require_nccl()
    except RuntimeError:
        return False
    return True


def gradient_device(grads: Sequence[Any]) -> int:
    """The one GPU that holds every array of ``grads`` (cupy arrays)."""
    devices = sorted({g.device.id for g in grads})
    if len(devices) > 1:
        raise ValueError(f"multi_node_mean_grad: this rank's gradients are on GPUs {devices}; "
                         "a rank's model must live on one GPU")
    return devices[0]


def check_same_device(first: Optional[int], device: int) -> None:
    """``RuntimeError`` unless the gradients are still on ``first``, the GPU NCCL was made on."""
    if device != first:
        raise RuntimeError(f"multi_node_mean_grad: the gradients moved from GPU {first} to GPU "
                           f"{device}; a communicator reduces on the GPU of its first reduction")


def bus_id(device: int) -> str:
    """The PCI bus id of ``device``, which names one GPU the same way in every process.

    Device numbers do not: where each rank sees only its own GPU
    (``CUDA_VISIBLE_DEVICES`` set per rank), every rank's GPU is device 0.
    """
    return str(cupy_module().cuda.Device(device).pci_bus_id)


def shared_gpus(intra: MPI.Comm, device: int) -> Optional[str]:
    """Which ranks of this node share a GPU, or None; collective over ``intra``."""
    seen = intra.allgather((bus_id(device), device))
    for bus in sorted({b for b, _ in seen}):
        ranks = [r for r, (b, _) in enumerate(seen) if b == bus]
        if len(ranks) > 1:
            numbers = sorted({d for b, d in seen if b == bus})
            return (f"ranks {ranks} of one node (intra_rank) all use the GPU at PCI bus "
                    f"{bus} (their device {', '.join(map(str, numbers))})")
    return None


NCCL_DTYPES = ("float16", "float32", "float64")  # what NcclGroup reduces


def check_wire_dtype(dtype: Any) -> Optional[np.dtype]:
    """``allreduce_grad_dtype`` as a dtype NCCL can sum, or None; ``TypeError`` otherwise."""
    if dtype is None:
        return None
    try:
        wire = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"allreduce_grad_dtype={dtype!r} is not a dtype: {e}") from e
    if wire.name not in NCCL_DTYPES:
        raise TypeError(f"allreduce_grad_dtype={wire.name} cannot be reduced by NCCL here; "
                        f"use one of {', '.join(NCCL_DTYPES)}")
    return wire


class NcclGroup:
    """An NCCL communicator over the ranks of ``comm``, on ``device``; made collectively.

    Each call runs on the current stream, in place on a contiguous cupy array.
    """

    def __init__(self, comm: MPI.Comm, device: int) -> None:
        from cupy.cuda import nccl

        self._nccl = nccl
        uid = comm.bcast(nccl.get_unique_id() if comm.rank == 0 else None, root=0)
        with cupy_module().cuda.Device(device):
            self._comm = nccl.NcclCommunicator(comm.size, uid, comm.rank)
        self.device = device
        self._codes = {np.dtype(name): getattr(nccl, f"NCCL_{name.upper()}")
                       for name in NCCL_DTYPES}

    def _args(self, buf: Any) -> Tuple[int, int, int, int]:
        stream = cupy_module().cuda.get_current_stream().ptr
        return buf.data.ptr, buf.size, self._codes[np.dtype(buf.dtype)], stream

    def allreduce(self, buf: Any) -> None:
        """The sum over every rank, in place."""
        ptr, n, code, stream = self._args(buf)
        self._comm.allReduce(ptr, ptr, n, code, self._nccl.NCCL_SUM, stream)

    def reduce(self, buf: Any) -> None:
        """The sum over every rank, in place on rank 0 (the others' ``buf`` is left as it was)."""
        ptr, n, code, stream = self._args(buf)
        self._comm.reduce(ptr, ptr, n, code, self._nccl.NCCL_SUM, 0, stream)

    def bcast(self, buf: Any) -> None:
        """Rank 0's ``buf`` on every rank, in place."""
        ptr, n, code, stream = self._args(buf)
        self._comm.bcast(ptr, n, code, 0, stream)

    def free(self) -> None:
        self._comm.destroy()
