"""Where a message may go: the rank and tag checks of every public entry point.

Each check has a fast path (one ``type`` test and a range) for the common
case, and only a value that fails it pays for the ABC checks and the error
text. ``Transport`` inherits them (through ``PickledMessages``).
"""
import numbers
from typing import Any, Tuple


class Routes:
    """Rank and tag checks against a communicator's size, this rank and its tags."""

    rank: int
    size: int
    control_tag: int  # the reserved top tag: mnpar's control messages
    tag_ub: int  # the largest tag users get

    def check_peer(self, peer: Any, name: str, allow_self: bool = False) -> int:
        if type(peer) is int and 0 <= peer < self.size and (peer != self.rank or allow_self):
            return peer  # the common case, without the ABC checks below
        if not isinstance(peer, numbers.Integral) or isinstance(peer, bool):
            raise TypeError(f"{name} must be an int rank, not {type(peer).__name__} {peer!r}")
        peer = int(peer)
        if not 0 <= peer < self.size:
            raise ValueError(f"{name}={peer} is out of range for a communicator of size "
                             f"{self.size}")
        if peer == self.rank and not allow_self:
            raise ValueError(f"{name}={peer} is this rank's own rank; a rank cannot send "
                             "to or receive from itself")
        return peer

    def check_tag(self, tag: Any) -> int:
        if type(tag) is int and 0 <= tag <= self.tag_ub:
            return tag
        if not isinstance(tag, numbers.Integral) or isinstance(tag, bool):
            raise TypeError(f"tag must be an int, not {type(tag).__name__} {tag!r}")
        tag = int(tag)
        if tag == self.control_tag:
            raise ValueError(f"tag={tag} is reserved for mnpar's control messages; use 0 to "
                             f"{self.tag_ub}")
        if not 0 <= tag <= self.tag_ub:
            raise ValueError(f"tag={tag} is out of range: MPI allows 0 to {self.tag_ub}")
        return tag

    def check_route(self, peer: Any, tag: Any, name: str) -> Tuple[int, int]:
        """``(check_peer(peer, name), check_tag(tag))``, the common case in one test."""
        if (type(peer) is int and type(tag) is int and 0 <= peer < self.size
                and peer != self.rank and 0 <= tag <= self.tag_ub):
            return peer, tag
        return self.check_peer(peer, name), self.check_tag(tag)
