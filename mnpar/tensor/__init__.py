"""Tensor parallelism: layers split inside over a group of ranks, exact or refused.

``parallelize(model, mesh_or_comm, plan)`` splits a chainer model's links as
a plan says (``Column``, ``Row``, ``Vocab``, ``ChannelOut``, ``ChannelIn``,
``Channel``; ``plans`` has ready ones), leaving the model's code as it is: a
guard makes every chainer function that meets a part exact or refuses it
with a ``TensorParallelError``. Outputs, losses and gradients are one
process's; initialization and saved snapshots too. See docs/tensor.rst.
"""
from ._conv import ChannelBatchNormalization
from ._count import collectives
from ._embed import VocabEmbedID
from ._errors import TensorParallelError
from ._linear import ColumnLinear, RowLinear
from ._marks import Shard
from ._parallelize import parallelize, tensor_group
from ._plans import cnn_plan, mlp_plan, transformer_plan
from ._styles import Channel, ChannelIn, ChannelOut, Column, Replicate, Row, Style, Vocab

__all__ = ["parallelize", "tensor_group", "TensorParallelError", "Style", "Column", "Row",
           "Vocab", "ChannelOut", "ChannelIn", "Channel", "Replicate", "ColumnLinear",
           "RowLinear", "VocabEmbedID", "ChannelBatchNormalization", "Shard", "collectives",
           "mlp_plan", "transformer_plan", "cnn_plan"]
