"""Objects and control messages over a transport: pickled, sent fire and forget.

Users' objects (``send_obj``/``recv_obj``) and mnpar's control messages (the
wiring check; end notices are ``_ending``'s) travel on the transport's
private communicator, pickled by mpi4py, and are kept in the transport's
outbox until MPI is done with them. Control messages use the reserved top
tag; a receive of any tag that meets one sets it aside for ``poll_control``
rather than hand it to the user. These are functions of a transport, as
the array collectives are (``_collectives``): they use its communicator,
its routes and its outbox, and add no state of their own.

A route on which an array's payload may come without its header
(``_routes``) is asked for the size an object must not have: such an object
is pickled here rather than by mpi4py and gets one byte more, so nothing
else ever has the size of a repeat; ``recv_obj`` refuses a payload the
route expects.
"""
from typing import Any, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .._errors import MessageMismatchError
from ._ending import MARK
from ._transport import Transport
from ._wait import probe


def send_obj(t: Transport, obj: Any, dest: int, tag: int = 0) -> None:
    """Sends a picklable object to ``dest`` without waiting for its receiver."""
    dest = t.routes.check_peer(dest, "dest")
    tag = t.routes.check_tag(tag)
    route = t.routes.find(dest, tag)
    avoid = route.size_to_avoid() if route is not None else None
    if avoid is None:
        req = t.comm.isend(obj, dest, tag)
    else:  # pickled as mpi4py does, never to a repeated array's size
        data = MPI.pickle.dumps(obj)
        if len(data) == avoid:
            data += b"\0"  # after the pickle's end: ignored
        req = t.comm.Isend([data, MPI.BYTE], dest, tag)  # the request keeps ``data``
    t.outbox.keep(req, dest, tag)


def recv_obj(t: Transport, source: int, tag: int = MPI.ANY_TAG,
             status: Optional[MPI.Status] = None) -> Any:
    """Receives an object from ``source`` with ``tag`` (any tag by default); ``status``
    gets its source and tag."""
    source = t.routes.check_peer(source, "source")
    if tag != MPI.ANY_TAG:
        tag = t.routes.check_tag(tag)
    status = MPI.Status() if status is None else status
    msg = probe(lambda: _improbe_user(t, source, tag, status), t.timeout,
                t.describe("recv_obj", source, None if tag == MPI.ANY_TAG else tag,
                           f"an object from rank {source}"))
    route = t.routes.find(source, status.Get_tag())
    known = route.payload(status.Get_count(MPI.BYTE)) if route is not None else None
    if known is not None:
        msg.Recv([np.empty(known.nbytes, np.uint8), MPI.BYTE])  # its sender goes on
        dtype, shape = known.specs[0]
        raise MessageMismatchError(
            f"rank {t.rank}: recv_obj from rank {source} on tag {status.Get_tag()} met a "
            f"{dtype} array of shape {tuple(shape)} that rank {source} sent with send; "
            "receive it with recv")
    return msg.recv()


def _improbe_user(t: Transport, source: int, tag: int,
                  status: MPI.Status) -> Optional[MPI.Message]:
    """``improbe``; a control message any tag matched is set aside for ``poll_control``."""
    msg = t.comm.improbe(source, tag, status)
    if msg is not None and status.Get_tag() == t.routes.control_tag:
        t.line.control(status.Get_source(), msg.recv())
        return None
    return msg


def post_control(t: Transport, payload: Any, dest: int) -> None:
    """Sends a pickled control message, fire and forget (the end drops it if unread)."""
    tag = t.routes.control_tag
    t.outbox.keep(t.comm.isend(payload, dest, tag), dest, tag)


def poll_control(t: Transport) -> Optional[Tuple[int, Any]]:
    """The next control message that has arrived, as ``(source, payload)``, or None (end
    notices are the line's, never returned)."""
    held = t.line.held
    if not held:
        t.line.take_control()
    return held.pop(0) if held else None


def discard_unread(t: Transport) -> int:
    """Receives and drops every message sent here and not yet read. Collective.

    Each rank posts every peer a mark on the control tag; MPI delivers one
    sender's messages in order to a receive that matches them all (any tag),
    so everything a peer sent before its mark, arrays, objects and control
    messages alike, is received and dropped here, silently. Returns how many
    were dropped.
    """
    t.line.mark()
    dropped = t.line.drain(MARK, report=False) + len(t.line.held)
    t.line.held.clear()
    return dropped
