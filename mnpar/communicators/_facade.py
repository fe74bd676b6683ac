"""What mnpar's other layers use of ``communicators/``, in one place.

The functions, the links, the pipeline, spatial and tensor parallelism, the
optimizers and the trainer glue import from here (or from the package's
public names), never from another private module of ``communicators/``
(``tests/test_layers.py`` forbids it). Moving a name between the
communicators' modules then changes this file and no other layer; what
crosses the boundary is listed below and in docs/internals.rst.

==========================  ======================================================
name                        what another layer does with it
==========================  ======================================================
``Communicator``            the type of every ``comm`` argument
``require_communicator``    the one check that an argument is an mnpar communicator
``Message``, ``TUPLE``,     what ``send_message``/``recv_message`` carry: arrays
``GRADIENT``                and flags (the functions, the pipeline's executor)
``Transport``               the type of ``Communicator.channel``'s result (the
                            pipeline's eager channel)
``wait``, ``probe``         a blocking wait or probe on MPI requests that honours
                            the communicator's timeout and a peer's end
``Waiting``, ``What``       what such a wait says when it times out (made by
                            ``Communicator.describe``)
``note_progress``           where this rank is (its iteration), for end notices
                            and ``PeerFinished`` texts
``PendingMean``,            a gradient mean started and finished apart (double
``grads_to_reduce``         buffering), and which gradients a mean covers
``Strategy``, ``MODELLED``, the reduction strategies' table: a row's options, the
``cost_of``                 strategies the cost model prices, and their costs
``nccl``                    cupy's NCCL, where a GPU path uses it directly
==========================  ======================================================
"""
from . import _nccl as nccl
from ._communicator import Communicator, require_communicator
from ._message import GRADIENT, TUPLE, Message
from ._reducers import PendingMean, grads_to_reduce
from ._strategies import MODELLED, Strategy, cost_of
from ._transport import Transport
from ._wait import probe, wait
from ._waiting import Waiting, What, note_progress

__all__ = ["Communicator", "require_communicator", "Message", "TUPLE", "GRADIENT",
           "Transport", "wait", "probe", "Waiting", "What", "note_progress", "PendingMean",
           "grads_to_reduce", "Strategy", "MODELLED", "cost_of", "nccl"]
