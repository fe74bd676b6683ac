"""Which programs of other ranks belong to the same model as this rank's.

Several MultiNodeChainLists may share a communicator, each on any subset of
its ranks, built and called in any order. Every rank announces each model's
program (``_wiring``) to every other rank at that model's first forward, so
each rank holds every rank's announcements in order. A model has no name the
ranks agree on; what they do agree on is the order of traffic between two
ranks, because their data messages match first in first out. So:

    the j-th announcement of rank a that talks with rank b is the same model
    as the j-th announcement of rank b that talks with rank a.

Following these links from this rank's program gives the model's members.
Example, three ranks, a model on {0, 1} and then a ring over all three::

    announcements   rank 0          rank 1          rank 2
    0               send 1, recv 1  recv 0, send 0  recv 1, send 0
    1               send 1, recv 2  recv 0, send 2

    rank 2's ring talks with rank 0 for the 1st time: rank 0's 1st
    announcement talking with rank 2 is its announcement 1, not 0.

A mention that has no counterpart yet is *pending*: the peer has not reached
that model's first forward, or it never will. Which, no rank can tell: a
model may be built at any time, so the check never blames a rank for a model
it has not announced; it simulates what is in, with the missing ranks as
wildcards, and checks again as announcements arrive. A peer whose newest
model hides some of its traffic is a wildcard at once. Programs that hide
traffic (``partial``: several models on one rank, plain ``send``/``recv``,
communicating links inside a component) link like any other, but the
simulation (``_wiring.hangs``) treats their ranks as wildcards.

Pure Python, no MPI: unit-tested in one process.
"""
from collections import Counter
from typing import Dict, FrozenSet, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ._wiring import Op, Problem, hangs


class Announcement(NamedTuple):
    """One model's program as its rank announced it."""

    ops: Tuple[Op, ...]
    partial: bool  # the rank has traffic on the communicator that ``ops`` does not show

    @property
    def peers(self) -> FrozenSet[int]:
        return frozenset(op.peer for op in self.ops)


History = Mapping[int, Sequence[Announcement]]  # rank -> its announcements, in order
Node = Tuple[int, int]  # (rank, index of the announcement)


def counterpart(history: History, node: Node, peer: int) -> Optional[int]:
    """The index of ``peer``'s announcement that is ``node``'s model, or None if not yet in."""
    rank, index = node
    j = sum(peer in a.peers for a in history[rank][:index + 1])
    for k, a in enumerate(history.get(peer, ())):
        if rank in a.peers:
            j -= 1
            if j == 0:
                return k
    return None


class Model(NamedTuple):
    """The members of one model found so far, and the mentions that link to nothing yet."""

    members: Dict[Node, None]  # insertion-ordered set
    pending: List[Tuple[Node, int]]  # (member, peer): the peer may still announce it


def gather(history: History, start: Node) -> Model:
    """Follows the links from ``start`` to every member of its model."""
    model = Model({start: None}, [])
    todo = [start]
    while todo:
        node = todo.pop()
        for peer in sorted(history[node[0]][node[1]].peers):
            k = counterpart(history, node, peer)
            if k is None:
                theirs = history.get(peer, ())
                if not theirs or not theirs[-1].partial:
                    model.pending.append((node, peer))
            elif (peer, k) not in model.members:
                model.members[(peer, k)] = None
                todo.append((peer, k))
    return model


def check(history: History, start: Node) -> Tuple[List[Problem], Dict[int, List[Op]]]:
    """What can never complete in ``start``'s model, and the programs simulated.

    Returns:
        The problems (empty if none) and, per rank whose program was
        simulated, that program. A rank with a partial program, or with two
        announcements in the model, is left out (a wildcard); so is every op
        whose link leads outside the members simulated.
    """
    model = gather(history, start)
    twice = {r for r, n in Counter(r for r, _ in model.members).items() if n > 1}
    known = {node: history[node[0]][node[1]] for node in model.members
             if node[0] not in twice and not history[node[0]][node[1]].partial}
    programs = {r: list(a.ops) for (r, _), a in sorted(known.items())}
    linked = {r: [op for op in a.ops if (op.peer, counterpart(history, (r, k), op.peer)) in known]
              for (r, k), a in known.items()}
    problems = hangs(linked)
    return problems, programs
