"""Data-parallel optimizers: average gradients over a communicator, then update; or shard
the model state over it (stages 1 to 3)."""
from ._create import create_multi_node_optimizer
from ._double_buffering import DoubleBufferingOptimizer
from ._multi_node import MultiNodeOptimizer
from ._sharded import ShardedOptimizer
from ._state_bytes import StateBytes, state_bytes

__all__ = ["create_multi_node_optimizer", "MultiNodeOptimizer", "DoubleBufferingOptimizer",
           "ShardedOptimizer", "state_bytes", "StateBytes"]
