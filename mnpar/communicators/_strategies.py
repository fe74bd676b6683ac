"""The gradient averaging strategies by name: what ``create_communicator`` picks from."""
from ._hierarchical import HierarchicalReducer
from ._pure_nccl import PureNcclReducer
from ._reducers import FlatReducer, NaiveReducer

REDUCERS = {cls.name: cls for cls in (NaiveReducer, FlatReducer, HierarchicalReducer,
                                      PureNcclReducer)}

__all__ = ["REDUCERS", "FlatReducer", "HierarchicalReducer", "NaiveReducer",
           "PureNcclReducer"]
