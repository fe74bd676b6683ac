"""Data-parallel optimizers: average gradients over a communicator, then update."""
from ._create import create_multi_node_optimizer
from ._double_buffering import DoubleBufferingOptimizer
from ._multi_node import MultiNodeOptimizer
from ._sharded import ShardedOptimizer

__all__ = ["create_multi_node_optimizer", "MultiNodeOptimizer", "DoubleBufferingOptimizer",
           "ShardedOptimizer"]
