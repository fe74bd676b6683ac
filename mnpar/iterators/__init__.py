"""Iterators that give several ranks the same batches (model-parallel groups)."""
from ._multi_node import create_multi_node_iterator
from ._synchronized import create_synchronized_iterator

__all__ = ["create_multi_node_iterator", "create_synchronized_iterator"]
