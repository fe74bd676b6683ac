"""Differentiable point-to-point communication: ``send`` and ``recv``.

Forward moves activations, backward moves their gradients the other way::

    rank 0                         rank 1
    h ──Send──> delegate           Recv ──> h'
         ^ backward: recv(gh)        backward: send(gh) ──┘

Each node has one extra input: the *delegate* of the previous communication
on this rank (or a phony empty variable). That input gives every node a place
in the graph even when none of its data needs a gradient, and it orders one
rank's communications: chainer runs backward from the highest node down, so a
node fed by an earlier node's delegate always runs its backward first. Both
nodes also return an empty placeholder, the new delegate.

A gradient travels flagged as one, and ``send``'s backward checks it against
the arrays it sent: a message out of place (a forgotten delegate) is a
``MessageMismatchError`` on both ranks (``_mismatch``), never a wrong array.
"""
import operator
import weakref
from typing import Any, List, Tuple

import chainer

from .._arrays import get_array_module, is_array
from .._errors import CommunicationError
from ..communicators._facade import GRADIENT, TUPLE, Communicator, Message, require_communicator
from ._mismatch import gradient_in_forward, wrong_gradient
from ._order import after_previous
from ._placeholder import (
    as_graph_input,
    as_variables,
    data_of,
    empty_like_device,
    spec_of,
)

_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")

# Communicators on which user code called send/recv directly; a MultiNodeChainList
# on one of them does not describe all of its rank's traffic.
PLAIN_USERS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _note_plain_use(communicator: Communicator) -> None:
    try:
        if communicator not in PLAIN_USERS:
            PLAIN_USERS.add(communicator)
    except TypeError:  # cannot be weakly referenced
        pass


def split_message(x: Any) -> Tuple[List[Any], bool]:
    """``(items, is_tuple)`` for a Variable/array or a tuple/list of them."""
    if isinstance(x, chainer.Variable) or is_array(x):
        return [x], False
    if isinstance(x, (tuple, list)):
        for i, item in enumerate(x):
            if not (isinstance(item, chainer.Variable) or is_array(item)):
                raise TypeError(f"x[{i}] must be a Variable or an array, not "
                                f"{type(item).__name__}")
        return list(x), True
    raise TypeError(f"x must be a Variable, an array, or a tuple/list of them, not "
                    f"{type(x).__name__}")


def _waited_for(e: CommunicationError, what: str) -> CommunicationError:
    """A failed wait's report, plus which message of the model it waited for (same
    class: a ``PeerLost`` or ``PeerFinished`` stays one)."""
    return type(e)(f"{e}; {what}")


class Send(chainer.FunctionNode):
    """Sends its inputs but the last (the delegate) to ``peer``; returns a new delegate."""

    def __init__(self, comm: Communicator, peer: int, tag: int, is_tuple: bool) -> None:
        self.comm = comm
        self.peer = peer
        self.tag = tag
        self.is_tuple = is_tuple

    @property
    def label(self) -> str:
        return f"Send (peer_rank: {self.peer})"

    def forward(self, inputs):
        xs, delegate = inputs[:-1], inputs[-1]
        self._delegate_spec = spec_of(delegate)
        self._delegate_xp = get_array_module(delegate)
        self._shapes = list(map(_SHAPE, xs))
        self._dtypes = list(map(_DTYPE, xs))
        try:
            self.comm.send_message(Message(list(xs), TUPLE if self.is_tuple else 0), self.peer,
                                   self.tag)
        except CommunicationError as e:
            raise _waited_for(e, f"forward pass: functions.send's arrays of shapes "
                              f"{self._shapes} to be received by rank {self.peer}") from None
        return empty_like_device(xs[0] if xs else delegate),

    def backward(self, indexes, grad_outputs):
        try:
            gxs, flags = self.comm.recv_message(self.peer, self.tag)
        except CommunicationError as e:
            raise _waited_for(e, f"backward pass: the gradients of the arrays of shapes "
                              f"{self._shapes} sent to rank {self.peer} in the forward "
                              "pass") from None
        if not flags & GRADIENT or len(gxs) != len(self._shapes) or any(
                g is not None and (g.shape != s or g.dtype != d)
                for g, s, d in zip(gxs, self._shapes, self._dtypes)):
            raise wrong_gradient(self.comm, self.peer, self.tag, self._shapes, self._dtypes,
                                 gxs, bool(flags & GRADIENT))
        g_delegate = self._delegate_xp.zeros(*self._delegate_spec)
        return (*(None if g is None else chainer.Variable(g, requires_grad=False)
                  for g in gxs), *as_variables((g_delegate,)))


class Recv(chainer.FunctionNode):
    """Receives from ``peer``; outputs the arrays received and then a new delegate."""

    def __init__(self, comm: Communicator, peer: int, tag: int) -> None:
        self.comm = comm
        self.peer = peer
        self.tag = tag
        self.is_tuple = False

    @property
    def label(self) -> str:
        return f"Recv (peer_rank: {self.peer})"

    def forward(self, inputs):
        delegate, = inputs
        try:
            arrays, flags = self.comm.recv_message(self.peer, self.tag)
        except CommunicationError as e:
            raise _waited_for(e, f"forward pass: the arrays rank {self.peer} sends with "
                              "functions.send") from None
        if flags & GRADIENT:
            raise gradient_in_forward(self.comm, self.peer, self.tag, arrays)
        self.is_tuple = bool(flags & TUPLE)
        self._specs = [spec_of(a) for a in arrays]
        self._delegate_spec = spec_of(delegate)
        self._delegate_xp = get_array_module(delegate)
        like = arrays[0] if arrays else delegate
        self._xp = get_array_module(like)
        return (*arrays, empty_like_device(like))

    def backward(self, indexes, grad_outputs):
        gys = [None if g is None else g.array for g in grad_outputs[:-1]]  # absent: no bytes
        flags = GRADIENT | (TUPLE if self.is_tuple else 0)
        try:
            self.comm.send_message(Message(gys, flags), self.peer, self.tag)
        except CommunicationError as e:
            raise _waited_for(e, f"backward pass: rank {self.peer} to receive the gradients "
                              "of the arrays it sent in the forward pass (a send on rank "
                              f"{self.peer} whose delegate variable never reached its "
                              "backward pass never receives them)") from None
        return as_variables((self._delegate_xp.zeros(*self._delegate_spec),))


def send_chained(x: Any, communicator: Communicator, rank: int, delegate: Any = None,
                 tag: int = 0) -> chainer.Variable:
    """``send`` whose node also takes ``delegate``, so its backward runs after
    the backward of everything built on the returned delegate. ``rank`` and
    ``tag`` are validated by the caller."""
    items, is_tuple = split_message(x)
    return _send_items(items, is_tuple, communicator, rank, delegate, tag)


def _send_items(items: List[Any], is_tuple: bool, communicator: Communicator, rank: int,
                delegate: Any, tag: int) -> chainer.Variable:
    first = data_of(items[0]) if items else None
    node = Send(communicator, rank, tag, is_tuple)
    out, = node.apply(tuple(items) + (as_graph_input(delegate, first),))
    after_previous(communicator, node, (out,))
    out.name = "delegate_variable"
    return out


def recv_chained(communicator: Communicator, rank: int, delegate: Any = None,
                 tag: int = 0) -> Tuple[Any, chainer.Variable]:
    """``recv`` that also returns a new delegate: ``(data, delegate)``.

    ``data`` is a Variable, or a tuple of them if a tuple was sent.
    """
    node = Recv(communicator, rank, tag)
    outs = node.apply((as_graph_input(delegate, data_of(delegate)),))
    after_previous(communicator, node, outs)
    data, placeholder = outs[:-1], outs[-1]
    placeholder.name = "delegate_variable"
    return (data if node.is_tuple else data[0]), placeholder


def send(x: Any, communicator: Communicator, rank: int, tag: int = 0) -> chainer.Variable:
    """Sends ``x`` to ``rank``; its backward receives the gradients from there.

    Args:
        x: a Variable or array, or a tuple/list of them (sent as one message
            and received as a tuple).
        communicator: an mnpar communicator.
        rank: the receiving rank (not this one).
        tag: the message tag; the receiver must use the same.

    Returns:
        chainer.Variable: the *delegate variable*, empty: return it from the
        model (or pass it to the next ``recv``) so that ``backward()``
        reaches this node and receives the gradients for ``x``.

    Raises:
        ValueError: ``rank`` is out of range or this rank.
        TypeError: ``x`` is not a Variable, an array or a tuple/list of them.

    Example::

        phi = mnpar.functions.send(h, comm, rank=1)
        y = mnpar.functions.recv(comm, rank=1, delegate_variable=phi)
    """
    require_communicator(communicator, "functions.send")
    items, is_tuple = split_message(x)
    rank, tag = communicator.check_route(rank, tag, "rank")
    _note_plain_use(communicator)
    return _send_items(items, is_tuple, communicator, rank, None, tag)


def recv(communicator: Communicator, rank: int, delegate_variable: Any = None, tag: int = 0,
         force_tuple: bool = False) -> Any:
    """Receives what ``rank`` sent with ``send``; its backward sends the gradients back.

    Args:
        communicator: an mnpar communicator.
        rank: the sending rank (not this one).
        delegate_variable: the delegate returned by this rank's previous
            ``send`` (or the output of the previous component); backward then
            runs this node before that one, the reverse of forward order.
        tag: the message tag used by the sender.
        force_tuple: return a tuple even for a single-array message.

    Returns:
        A Variable, or a tuple of Variables if a tuple was sent (always a
        tuple with ``force_tuple``).

    Raises:
        ValueError: ``rank`` is out of range or this rank.
    """
    require_communicator(communicator, "functions.recv")
    rank, tag = communicator.check_route(rank, tag, "rank")
    _note_plain_use(communicator)
    data, _ = recv_chained(communicator, rank, delegate_variable, tag)
    if force_tuple and not isinstance(data, tuple):
        return (data,)
    return data
