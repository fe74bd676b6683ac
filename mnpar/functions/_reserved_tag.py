"""The reserved tag for mnpar's control messages.

The MultiNodeChainList wiring check sends small control messages on the
transport's ``control_tag`` (the largest MPI tag, which users cannot pick),
fire and forget; a rank that takes no part never receives them. The
transport drops unread ones when its communicator is freed.
"""
from typing import Any


def reserved_tag(comm: Any) -> int:
    return comm._t.control_tag
