"""Routes: where a message may go, and what each route remembers.

A route is a peer and a tag. A user's peer and tag are checked once per
route, when its ``Route`` is made (``check_route``: one ``type`` test and a
range for the common value; only a value that fails it pays for the ABC
checks and the error text); the table, keyed by exact ints, holds checked
routes only, so the send and the receive that find a route there have
checked it. What a transport remembers of a route lives in that one object,
and nowhere else:

============  ===========================================  =========================
field         what                                         who uses it
============  ===========================================  =========================
``first``     the persistent receive of the route's next   the arrival
              message (``Recv_init`` once, then ``Start``)  (``Transport._arrive``)
``likely``    bytes of the last large message received     the arrival's wait: it
              there                                        spins that much longer
``sent``      dtype, shape and flags (and ``sent_bytes``)  the framing: an array with
              of the last repeatable array sent there      that header goes as its
                                                           payload alone;
                                                           ``send_obj`` (a size to
                                                           avoid)
``known``     the header of the last repeatable message   the arrival: that array's
              received there                               receive is posted first;
                                                           the drain, ``recv_obj``
                                                           (``payload``)
``spare``     memory posted for a repeat that a header     the next payload's receive
              took instead
``sender``    what sends there (``name_sender``)           the end notice
============  ===========================================  =========================

Repeats (docs/protocol.rst): a *repeatable* message is one host array (a
gradient or not) of more than ``FIRST_LIMIT`` bytes sent in one piece
(``message.repeatable``). Sender and receiver note each one in MPI's order
by that one rule, so both know the same header; the framing then sends an
array with that very header as its payload alone, and the arrival posts its
receive before anything comes. Any other message's first MPI message has at
most ``FIRST_LIMIT`` bytes, fewer than any repeatable payload, and a pickled
object on such a route is never of the payload's size (``size_to_avoid``).
The routes outlive their transport with its line (``_ending``), whose drain
asks them what an unread message is.
"""
import numbers
from typing import Dict, Optional, Tuple

import numpy as np
from mpi4py import MPI

from . import _message as message

MAX_FIRST = 256  # persistent receives kept (one per route) before starting afresh
MAX_ROUTES = 4096  # routes kept before those holding nothing lasting are let go
SentKey = Tuple[np.dtype, Tuple[int, ...], int]  # what decides a one-array header


class Route:
    """What a transport remembers of one peer and tag (the module's table)."""

    __slots__ = ("first", "likely", "sent", "sent_bytes", "known", "spare", "sender")

    def __init__(self) -> None:
        self.first: Optional[MPI.Prequest] = None
        self.likely = 0
        self.sent: Optional[SentKey] = None
        self.sent_bytes = 0
        self.known: Optional[message.Header] = None
        self.spare: Optional[np.ndarray] = None
        self.sender: Optional[str] = None

    def learn(self, header: message.Header, max_chunk: int) -> None:
        """Notes a header received here if it is repeatable (the sender's rule)."""
        if message.repeatable_header(header, max_chunk):
            self.known = header

    def payload(self, nbytes: int) -> Optional[message.Header]:
        """The header of a repeat whose payload alone is ``nbytes`` long, if a message of
        that size here is one (the drain, ``recv_obj``); else None."""
        known = self.known
        return known if known is not None and known.nbytes == nbytes else None

    def size_to_avoid(self) -> Optional[int]:
        """The size no pickled object sent here may have: the payload of a repeat."""
        return self.sent_bytes if self.sent is not None else None

    def take_spare(self, dtype: Optional[np.dtype],
                   shape: Tuple[int, ...]) -> Optional[np.ndarray]:
        """The memory posted for a repeat, if it fits a payload of ``dtype`` and ``shape``."""
        spare, self.spare = self.spare, None
        if spare is not None and spare.dtype == dtype and spare.shape == shape:
            return spare
        return None


class Routes:
    """The checks of a communicator's ranks and tags, and its table of ``Route``s.

    Args:
        rank: this rank.
        size: the communicator's size.
        tag_ub: MPI's largest tag; the largest is mnpar's (``control_tag``).
    """

    def __init__(self, rank: int, size: int, tag_ub: int) -> None:
        self.rank = rank
        self.size = size
        # The largest tag carries mnpar's own control messages (the wiring check,
        # end notices), fire and forget; users get every tag below it.
        self.control_tag = tag_ub
        self.tag_ub = tag_ub - 1
        self.table: Dict[Tuple[int, int], Route] = {}
        self.firsts = 0  # routes with a persistent receive

    def route(self, peer: int, tag: int, name: str = "peer") -> Route:
        """The route to or from ``peer`` on ``tag``, made at its first use once
        ``check_route`` has passed (naming ``peer`` as ``name``): the table holds checked
        routes only, so a caller that finds one by exact ints needs no check."""
        route = self.table.get((peer, tag))
        if route is None:
            peer, tag = self.check_route(peer, tag, name)
            if len(self.table) >= MAX_ROUTES:
                self._forget()
            route = self.table.setdefault((peer, tag), Route())
        return route

    def _forget(self) -> None:
        """Lets go of the routes that hold nothing a peer relies on (no repeat's header,
        sent or received, and no sender's name), freeing their persistent receives: a
        program whose tags never repeat keeps a bounded table. Such a route is made
        again, and checked again, at its next use."""
        for key, route in list(self.table.items()):
            if route.sent is None and route.known is None and route.sender is None:
                if route.first is not None:
                    route.first.Free()
                    self.firsts -= 1
                del self.table[key]

    def find(self, peer: int, tag: int) -> Optional[Route]:
        """The route, if anything was remembered of it."""
        return self.table.get((peer, tag))

    def make_first(self, comm: MPI.Comm, route: Route, buf: np.ndarray, peer: int,
                   tag: int) -> MPI.Prequest:
        """``route``'s persistent receive into ``buf``, made now (after freeing every
        other once ``MAX_FIRST`` are kept)."""
        if self.firsts >= MAX_FIRST:
            self.free_requests()
        route.first = comm.Recv_init([buf, MPI.BYTE], peer, tag)
        self.firsts += 1
        return route.first

    def drop_first(self, route: Route) -> None:
        """Frees ``route``'s persistent receive (cancelled: never started again)."""
        if route.first is not None:
            route.first.Free()
            route.first = None
            self.firsts -= 1

    def free_requests(self) -> None:
        """Frees every persistent receive (none is active between messages)."""
        for route in self.table.values():
            if route.first is not None:
                route.first.Free()
                route.first = None
            route.likely = 0
        self.firsts = 0

    def senders(self, peer: int) -> Dict[int, str]:
        """tag -> what sends this rank's messages to ``peer`` with it (its end notice)."""
        return {tag: route.sender for (dest, tag), route in self.table.items()
                if dest == peer and route.sender is not None}

    # -- checks ---------------------------------------------------------------

    def check_peer(self, peer: object, name: str, allow_self: bool = False) -> int:
        """``peer`` as an int rank; ``TypeError``/``ValueError`` naming ``name``."""
        if type(peer) is int and 0 <= peer < self.size and (peer != self.rank or allow_self):
            return peer  # the common case, without the ABC checks below
        if not isinstance(peer, numbers.Integral) or isinstance(peer, bool):
            raise TypeError(f"{name} must be an int rank, not {type(peer).__name__} {peer!r}")
        rank = int(peer)
        if not 0 <= rank < self.size:
            raise ValueError(f"{name}={rank} is out of range for a communicator of size "
                             f"{self.size}")
        if rank == self.rank and not allow_self:
            raise ValueError(f"{name}={rank} is this rank's own rank; a rank cannot send "
                             "to or receive from itself")
        return rank

    def check_tag(self, tag: object) -> int:
        """``tag`` as an int a user message may carry; ``TypeError``/``ValueError``."""
        if type(tag) is int and 0 <= tag <= self.tag_ub:
            return tag
        if not isinstance(tag, numbers.Integral) or isinstance(tag, bool):
            raise TypeError(f"tag must be an int, not {type(tag).__name__} {tag!r}")
        value = int(tag)
        if value == self.control_tag:
            raise ValueError(f"tag={value} is reserved for mnpar's control messages; use 0 to "
                             f"{self.tag_ub}")
        if not 0 <= value <= self.tag_ub:
            raise ValueError(f"tag={value} is out of range: MPI allows 0 to {self.tag_ub}")
        return value

    def check_route(self, peer: object, tag: object, name: str) -> Tuple[int, int]:
        """``(check_peer(peer, name), check_tag(tag))``, the common case in one test."""
        if (type(peer) is int and type(tag) is int and 0 <= peer < self.size
                and peer != self.rank and 0 <= tag <= self.tag_ub):
            return peer, tag
        return self.check_peer(peer, name), self.check_tag(tag)
