"""ChainerMN's communicator classes, for code that builds one directly.

ChainerMN users may write ``NaiveCommunicator(mpi_comm)`` instead of
``create_communicator('naive', mpi_comm)``, or subclass
``MpiCommunicatorBase``. Each class here is the one ``Communicator`` with its
gradient reduction fixed; ``create_communicator`` returns an instance of the
class of the name it was given::

    name             class                      reduction
    naive            NaiveCommunicator          naive
    flat             FlatCommunicator           flat
    hierarchical     HierarchicalCommunicator   hierarchical
    non_cuda_aware   NonCudaAwareCommunicator   hierarchical (NCCL in a node, MPI between)
    pure_nccl        PureNcclCommunicator       pure_nccl
"""
from typing import Any, Dict, Optional, Type

from mpi4py import MPI

from ._communicator import Communicator
from ._strategies import NAMES


class MpiCommunicatorBase(Communicator):
    """The base of the named communicators; its own reduction is ``naive``.

    Args:
        mpi_comm: the MPI communicator (default ``MPI.COMM_WORLD``); mnpar
            works on a private duplicate of it.
        **config: ``timeout``, ``cuda_aware``, ``allreduce_grad_dtype``, as
            :func:`mnpar.create_communicator` takes them.

    Raises:
        TypeError: ``mpi_comm`` is not an mpi4py communicator.

    Example::

        comm = mnpar.communicators.NaiveCommunicator(MPI.COMM_WORLD)
    """

    reduction = "naive"

    def __init__(self, mpi_comm: Optional[MPI.Comm] = None, **config: Any) -> None:
        mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        if not isinstance(mpi_comm, MPI.Comm):
            raise TypeError(f"mpi_comm must be an mpi4py communicator, not "
                            f"{type(mpi_comm).__name__}")
        super().__init__(mpi_comm, self.reduction, **config)


class NaiveCommunicator(MpiCommunicatorBase):
    """The ``naive`` reduction (:doc:`communicators` compares them)."""

    reduction = "naive"


class FlatCommunicator(MpiCommunicatorBase):
    """The ``flat`` reduction."""

    reduction = "flat"


class HierarchicalCommunicator(MpiCommunicatorBase):
    """The ``hierarchical`` reduction: inside each node first, then across nodes."""

    reduction = "hierarchical"


class NonCudaAwareCommunicator(MpiCommunicatorBase):
    """ChainerMN's ``non_cuda_aware``: NCCL inside a node, MPI through the host between
    nodes; mnpar's ``hierarchical``."""

    reduction = "hierarchical"


class PureNcclCommunicator(MpiCommunicatorBase):
    """The ``pure_nccl`` reduction: GPU gradients, NCCL over all ranks."""

    reduction = "pure_nccl"


def _classes() -> Dict[str, Type[MpiCommunicatorBase]]:
    """communicator name -> class: a class per strategy of the table (its
    ``reduction``), and ChainerMN's ``non_cuda_aware``; checked at import."""
    own = (NaiveCommunicator, FlatCommunicator, HierarchicalCommunicator, PureNcclCommunicator)
    classes: Dict[str, Type[MpiCommunicatorBase]] = {cls.reduction: cls for cls in own}
    missing = [name for name in NAMES if name not in classes]
    if missing or len(classes) != len(own):
        raise ValueError(f"communicator classes: strategies {missing} have no class, or "
                         "two classes share one")
    classes["non_cuda_aware"] = NonCudaAwareCommunicator
    return classes


CLASSES = _classes()
