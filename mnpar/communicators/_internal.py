"""The communicator's internal API: what mnpar's own layers use, never ``_t``.

The links, the pipeline, the optimizers and spatial parallelism reach the
transport only through these methods, which ``Communicator`` inherits; users
need none of them (docs/internals.rst lists them; the API reference does
not). Each call is validated once, by the public entry that makes it.
"""
from typing import Any, Dict, Optional, Tuple

import chainer
from mpi4py import MPI

from . import _objects as objects
from ._message import Message
from ._model_checks import check_finite, check_link, check_same_grads
from ._outbox import Eager
from ._reducers import FlatReducer, PendingMean, grads_to_reduce
from ._strategies import Strategy
from ._transport import Transport
from ._waiting import Waiting, What


class InternalApi:
    """What mnpar's layers call on a communicator (``Communicator`` inherits it)."""

    _t: Transport
    _reducer: FlatReducer
    _fingerprints: Dict[Tuple[Any, ...], int]
    name: str
    strategy: Strategy  # the row of ``_strategies`` this communicator averages by

    @property
    def private_comm(self) -> MPI.Comm:
        """The private MPI duplicate mnpar talks on (internal: not for user messages)."""
        return self._t.comm

    def check_peer(self, peer: object, name: str, allow_self: bool = False) -> int:
        """``peer`` as an int rank of this communicator; TypeError/ValueError naming ``name``."""
        return self._t.routes.check_peer(peer, name, allow_self)

    def describe(self, op: str, peer: Optional[int], tag: Optional[int], what: What,
                 watch: Optional[int] = None) -> Waiting:
        """What a wait of ``op`` for ``what`` waits on (for ``wait``): its
        ``CommunicationTimeout`` text, and the peer (``peer``, or ``watch`` where the
        text names none; every rank: None) whose end is a ``PeerFinished``."""
        return self._t.describe(op, peer, tag, what, watch)

    def check_route(self, peer: object, tag: object, name: str) -> Tuple[int, int]:
        """``check_peer(peer, name)`` and the ``tag`` a user message may carry, in one call."""
        return self._t.routes.check_route(peer, tag, name)

    def send_message(self, msg: Message, dest: int, tag: int) -> None:
        """``send`` for a layer that validated its arguments (``check_route``) and
        made its message (``_message.Message``: arrays, None where one is absent,
        and flags, ``TUPLE`` or ``GRADIENT``): straight to the transport's framing."""
        self._t.send_arrays(msg.arrays, msg.flags, dest, tag)

    def recv_message(self, source: int, tag: int) -> Message:
        """``recv`` for a layer that validated its arguments: the message received
        (its arrays and flags: ``TUPLE``, the sender sent a tuple; ``GRADIENT``, a
        gradient sent back)."""
        return self._t.recv_message(source, tag)

    def report(self, text: str, dest: int, tag: int) -> None:
        """Tells ``dest`` about an error found in its messages, fire and forget: its
        next receive from this rank with ``tag`` raises ``MessageMismatchError``."""
        self._t.report(text, dest, tag)

    def channel(self, via: str) -> Transport:
        """A transport of its own, on a duplicate of the private communicator
        (collective), with the eager outbox: its sends never wait for their receiver
        and free their copies as they complete: the pipeline's messages, which
        ``via`` names in errors (" through the pipeline")."""
        return Transport(self._t.comm, self._t.timeout, self._t.cuda_aware, Eager, via)

    def nccl_sum(self, buf: Any) -> None:
        """Sums a GPU array over every rank, in place, with the NCCL group of a strategy
        that holds one (``pure_nccl``; made, collectively, at its first use); batch
        normalization's path."""
        if not self.strategy.nccl:
            raise ValueError(f"nccl_sum needs a pure_nccl communicator, not {self.name!r}")
        self._reducer.nccl_group(buf.device.id).allreduce(buf)

    def name_sender(self, peer: int, tag: int, kind: str) -> None:
        """Names what sends this rank's messages to ``peer`` with ``tag`` (``"a
        MultiNodeChainList"``): a message of that route left unread is reported as sent
        by it (``_ending``)."""
        self._t.routes.route(peer, tag).sender = kind

    def post_control(self, payload: Any, peer: int) -> None:
        """Sends a control message (pickled) to ``peer``, fire and forget."""
        objects.post_control(self._t, payload, peer)

    def poll_control(self) -> Optional[Tuple[int, Any]]:
        """A control message that has arrived, as ``(source, payload)``; None if none."""
        return objects.poll_control(self._t)

    def start_mean_grad(self, model: chainer.Link, zero_fill: bool = False) -> PendingMean:
        """Checks that every rank reduces the same gradients, then starts their mean
        with this communicator's strategy; ``finish_mean_grad`` completes it.

        Internal (double buffering finishes it an update later). Until then the
        gradients may be replaced but not written into.
        """
        check_link(model, "multi_node_mean_grad")
        params = grads_to_reduce(model.namedparams(), zero_fill)
        check_same_grads(self, model, params, self._fingerprints)
        pending = self._reducer.start_mean(params)
        pending.model = model
        return pending

    def finish_mean_grad(self, pending: PendingMean, apply: bool = True) -> None:
        """Waits for a mean ``start_mean_grad`` started (collective); with ``apply`` the
        means become the gradients, else they are dropped (internal)."""
        self._reducer.finish(pending, apply)
        if apply and chainer.is_debug():
            check_finite(pending.model, pending.params)
