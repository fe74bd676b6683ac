"""One checkpoint format for every layout: shards and an index, loadable anywhere.

Every rank writes its shards of every array (parameters, optimizer state)
and its values (the trainer's and iterators' state) into its own file, at
once; an index names each array's global shape and which part each file
holds. A checkpoint written by any layout (plain or sharded data
parallelism, pipeline stages, model-parallel pieces, at any rank count)
loads into any other, bit for bit. ``python -m mnpar.checkpoint`` lists one
and consolidates it into one chainer npz (docs/sharded.rst).
"""
from ._api import holdings, load, save
from ._errors import CheckpointError
from ._format import Index, read_index
from ._tool import consolidate, latest, listing

__all__ = ["save", "load", "read_index", "Index", "CheckpointError", "consolidate", "latest",
           "listing", "holdings"]
