"""Communicators: who talks to whom, and how gradients are averaged."""
from typing import Any, Optional

from mpi4py import MPI

from . import _nccl
from ._blas import limit_blas_threads
from ._classes import (
    CLASSES,
    FlatCommunicator,
    HierarchicalCommunicator,
    MpiCommunicatorBase,
    NaiveCommunicator,
    NonCudaAwareCommunicator,
    PureNcclCommunicator,
)
from ._communicator import Communicator, CommunicatorBase
from ._devices import gpu_index
from ._strategies import NAMES, strategy_of

__all__ = ["create_communicator", "Communicator", "CommunicatorBase", "NAMES",
           "MpiCommunicatorBase", "NaiveCommunicator", "FlatCommunicator",
           "HierarchicalCommunicator", "NonCudaAwareCommunicator", "PureNcclCommunicator",
           "gpu_index"]

# NAMES: the strategies' (``_strategies``); ChainerMN's 'non_cuda_aware' is also
# accepted: 'hierarchical'.

_CONFIG = ("timeout", "cuda_aware", "allreduce_grad_dtype", "batched_copy",
           "limit_blas_threads")
_blas_limited = False


def default_name(mpi_comm: MPI.Comm, ranks_on_node: int) -> str:
    """``pure_nccl`` where every rank has cupy, NCCL and a GPU of its own, else ``hierarchical``.

    Collective over ``mpi_comm``: the ranks decide together, so a job whose
    nodes differ never builds two kinds of communicator. NCCL takes one rank
    per device, so a node with more ranks (``ranks_on_node``) than GPUs uses
    ``hierarchical``. On CPUs ``hierarchical`` averages through shared memory
    inside a node and measures fastest (``make bench``).
    """
    try:
        can = _nccl.require_nccl().cuda.runtime.getDeviceCount() >= ranks_on_node
    except RuntimeError:
        can = False
    return "pure_nccl" if mpi_comm.allreduce(can, op=MPI.LAND) else "hierarchical"


def ranks_on_this_node(mpi_comm: MPI.Comm) -> int:
    """How many ranks of ``mpi_comm`` share this rank's node; collective."""
    shared = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    size = shared.size
    shared.Free()
    return size


def create_communicator(communicator_name: Optional[str] = None,
                        mpi_comm: Optional[MPI.Comm] = None, **config: Any) -> Communicator:
    """Creates a communicator over every rank of ``mpi_comm``; collective.

    Args:
        communicator_name: ``'naive'``, ``'flat'``, ``'hierarchical'`` or
            ``'pure_nccl'`` (ChainerMN's ``'non_cuda_aware'`` is ``'hierarchical'``);
            None picks the best that works here.
        mpi_comm: the MPI communicator to use (default ``MPI.COMM_WORLD``);
            mnpar works on a private duplicate of it.
        timeout: seconds any wait may last before ``CommunicationTimeout``
            (default ``MNPAR_TIMEOUT`` or 600; 0 for none).
        cuda_aware: MPI reads GPU memory directly (else staged through host).
        allreduce_grad_dtype: ``pure_nccl`` only: the dtype gradients are
            reduced in (e.g. ``numpy.float16``).
        batched_copy: accepted for ChainerMN compatibility; packing is always batched.
        limit_blas_threads: limit BLAS threads to this rank's share of the
            node's cores, or to Slurm's ``--cpus-per-task`` where that is set
            (default True, unless a thread variable is set).

    Returns:
        Communicator: the new communicator, of the name's class (``NaiveCommunicator``...).

    Raises:
        ValueError: an unknown name, or ``allreduce_grad_dtype`` without ``pure_nccl``.
        TypeError: an unknown keyword, or an ``allreduce_grad_dtype`` NCCL
            cannot sum (not float16/32/64).
        RuntimeError: ``pure_nccl`` without cupy, NCCL or a GPU.

    Example::

        comm = mnpar.create_communicator("naive")
    """
    global _blas_limited
    unknown = sorted(set(config) - set(_CONFIG))
    if unknown:
        raise TypeError(f"create_communicator got unknown keyword(s) {unknown}; "
                        f"valid: {list(_CONFIG)}")
    if communicator_name is not None and communicator_name not in CLASSES:
        raise ValueError(f"unknown communicator_name {communicator_name!r}; valid names: "
                         f"{list(CLASSES)}")
    mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    if not isinstance(mpi_comm, MPI.Comm):
        raise TypeError(f"mpi_comm must be an mpi4py communicator, not {type(mpi_comm).__name__}")
    limit_blas = config.pop("limit_blas_threads", True) and not _blas_limited
    on_node = ranks_on_this_node(mpi_comm) if limit_blas or communicator_name is None else 0
    name = default_name(mpi_comm, on_node) if communicator_name is None else communicator_name
    if config.get("allreduce_grad_dtype") is not None and not strategy_of(
            CLASSES[name].reduction).wire_dtype:
        raise ValueError(f"allreduce_grad_dtype is supported by 'pure_nccl' only, not {name!r}")
    if limit_blas:
        limit_blas_threads(on_node)
        _blas_limited = True
    batched_copy = config.pop("batched_copy", True)
    comm = CLASSES[name](mpi_comm, **config)
    comm.set_config("batched_copy", batched_copy)
    return comm
