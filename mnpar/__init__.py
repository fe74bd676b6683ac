"""mnpar: model-parallel training for Chainer on MPI, ChainerMN-compatible.

Code written for ChainerMN's model-parallel API runs by changing the import::

    import mnpar as chainermn
"""
import _mnpar_compat.start  # noqa: F401 - done at start-up already, unless without site

from . import (
           checkpoint,
           datasets,
           extensions,
           functions,
           global_except_hook,
           iterators,
           links,
           optimizer_hooks,
           optimizers,
           pipeline,
           random,
           spatial,
           tensor,
)
from ._errors import (
           CommunicationError,
           CommunicationTimeout,
           DataSizeError,
           MessageMismatchError,
           PeerFinished,
           PeerLost,
           UnreadMessageWarning,
           WiringError,
)
from ._failfast import install as _install_failfast
from ._mesh import Mesh
from .communicators import CommunicatorBase, create_communicator
from .datasets import scatter_dataset, scatter_index
from .extensions import create_multi_node_checkpointer, create_multi_node_evaluator
from .links import MultiNodeChainList
from .optimizers import create_multi_node_optimizer

__version__ = "0.1.0"

__all__ = ["create_communicator", "CommunicatorBase", "CommunicationError",
           "CommunicationTimeout", "PeerLost", "PeerFinished", "UnreadMessageWarning",
           "WiringError", "MessageMismatchError",
           "DataSizeError", "__version__", "MultiNodeChainList", "functions", "links",
           "datasets", "extensions", "optimizers", "optimizer_hooks",
           "create_multi_node_optimizer",
           "scatter_dataset", "scatter_index", "create_multi_node_evaluator",
           "create_multi_node_checkpointer", "iterators", "pipeline", "spatial",
           "global_except_hook", "Mesh", "random", "checkpoint", "tensor"]

_install_failfast()
