"""Differentiable communication: ``chainer.FunctionNode`` objects over a communicator.

Point to point (``send``, ``recv``, ``pseudo_connect``) and collectives
(``bcast``, ``gather``, ``scatter``, ``allgather``, ``alltoall``,
``allreduce``), with ChainerMN's names, arguments and defaults; ``scatter_batch`` and
``gather_batch`` over nested structures of a batch; and, for tensor parallelism
(every rank of a group holds the same loss), the conjugate collectives
``copy_to_group``, ``reduce_from_group``, ``scatter_to_group``,
``gather_from_group``, ``gather_to_group`` and ``reduce_scatter_from_group``.
"""
from ._collectives import allgather, allreduce, alltoall, bcast, gather, scatter
from ._conjugate import (
    copy_to_group,
    gather_from_group,
    gather_to_group,
    reduce_from_group,
    reduce_scatter_from_group,
    scatter_to_group,
)
from ._nested import gather_batch, scatter_batch
from ._point_to_point import recv, send
from ._pseudo_connect import pseudo_connect

__all__ = ["send", "recv", "pseudo_connect", "bcast", "gather", "scatter", "allgather",
           "alltoall", "allreduce", "scatter_batch", "gather_batch", "copy_to_group",
           "reduce_from_group", "scatter_to_group", "gather_from_group", "gather_to_group",
           "reduce_scatter_from_group"]
