"""Data-parallel optimizers: average gradients over a communicator, then update."""
from ._double_buffering import DoubleBufferingOptimizer
from ._multi_node import MultiNodeOptimizer, create_multi_node_optimizer

__all__ = ["create_multi_node_optimizer", "MultiNodeOptimizer", "DoubleBufferingOptimizer"]
