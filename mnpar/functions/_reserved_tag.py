"""The reserved tag for mnpar's control messages, and cleaning it up.

The MultiNodeChainList wiring check sends small control messages on the
largest MPI tag of the communicator's private duplicate, fire and forget; a
rank that takes no part never receives them. MPI recycles a freed
communicator's context, and messages still queued for it would then match a
receive on the *next* communicator. So every communicator on which mnpar
sent or may receive such messages discards what is left on that tag just
before it is freed. Array messages never use the tag, so nothing else is
touched.
"""
from typing import Any

from mpi4py import MPI


def reserved_tag(comm: Any) -> int:
    return comm._t.tag_ub


def discard_leftovers_on_free(comm: Any) -> None:
    """Makes ``comm.finalize()`` first drop unreceived messages on the reserved tag."""
    transport = getattr(comm, "_t", None)
    if transport is None or getattr(transport, "_mnpar_discards_reserved", False):
        return
    free = transport.free

    def discard_then_free() -> None:
        if transport.comm != MPI.COMM_NULL:
            discard(transport.comm, transport.tag_ub)
        free()

    transport.free = discard_then_free
    transport._mnpar_discards_reserved = True


def discard(mpi_comm: MPI.Comm, tag: int) -> int:
    """Receives and drops every message that has arrived on ``tag``; returns how many."""
    count = 0
    while True:
        msg = mpi_comm.improbe(MPI.ANY_SOURCE, tag)
        if msg is None:
            return count
        msg.recv()
        count += 1
