"""The wiring of MultiNodeChainLists as programs, and a simulator that runs them.

Each rank's model is a list of components with ``rank_in``/``rank_out``. In
forward it does, component by component, one receive per rank of
``rank_in`` and one send per rank of ``rank_out`` (a rank's own rank goes
through a local queue instead). That is a *program*: a list of ``Op``s::

    rank 0: add_link(A, None, 1); add_link(B, 1, None)   ->  send 1, recv 1
    rank 1: add_link(C, 0, 0)                            ->  recv 0, send 0

``simulate`` runs the programs of the ranks it knows together, with sends
buffered (they never wait) and receives blocking, matching messages first in
first out per pair of ranks, as MPI does on one tag. What remains is the
wiring error: a receive that can never be satisfied, or a send that no one
receives. Ranks whose program is unknown are wildcards: they are assumed to
send and receive whatever the known ranks need, so the check never rejects a
program merely because it cannot see all of it. Backward runs every program
in reverse with the directions swapped; its graph of waits is the forward
graph reversed, so a forward that cannot deadlock gives a backward that
cannot either.

Pure Python, no MPI: unit-tested in one process.
"""
from collections import deque
from typing import Deque, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from .._errors import WiringError

Ranks = Optional[Tuple[int, ...]]
Wiring = Tuple[Ranks, Ranks]  # (rank_in, rank_out) of one component


class Op(NamedTuple):
    """One communication of a program: ``kind`` is ``"send"`` or ``"recv"``."""

    kind: str
    peer: int
    component: int

    def describe(self, rank: int) -> str:
        verb = "sends to" if self.kind == "send" else "receives from"
        return f"rank {rank} component {self.component} {verb} rank {self.peer}"


class Problem(NamedTuple):
    """An operation of ``rank`` that can never complete, and why."""

    rank: int
    op: Op
    reason: str


def program(rank: int, wirings: Sequence[Wiring]) -> List[Op]:
    """The sends and receives of one rank's components, in forward order."""
    ops: List[Op] = []
    for i, (rank_in, rank_out) in enumerate(wirings):
        ops += [Op("recv", r, i) for r in rank_in or () if r != rank]
        ops += [Op("send", r, i) for r in rank_out or () if r != rank]
    return ops


def check_self_sends(rank: int, wirings: Sequence[Wiring]) -> None:
    """Raises WiringError unless every receive from this rank follows a send to it
    and every send to it is received.
    """
    queued: Deque[int] = deque()
    for i, (rank_in, rank_out) in enumerate(wirings):
        for r in rank_in or ():
            if r == rank:
                if not queued:
                    raise WiringError(
                        f"rank {rank} component {i} has rank_in={list(rank_in or ())} and so "
                        f"receives from its own rank {rank}, but no earlier component sends "
                        f"to rank {rank} (add it to an earlier rank_out)")
                queued.popleft()
        queued.extend(i for r in rank_out or () if r == rank)
    if queued:
        raise WiringError(
            f"rank {rank} component {queued[0]} sends to its own rank {rank} (rank_out), but "
            f"no later component receives it (add rank {rank} to a later rank_in)")


def simulate(programs: Mapping[int, Sequence[Op]]) -> List[Problem]:
    """Runs the known ranks' programs together; returns what can never complete.

    Args:
        programs: rank -> its ops, for every rank whose program is known.

    Returns:
        The problems, empty when every send meets a receive and no rank waits
        forever. A receive or send involving an unknown rank always succeeds.
    """
    pos = {r: 0 for r in programs}
    channels: Dict[Tuple[int, int], Deque[Op]] = {}
    progress = True
    while progress:
        progress = False
        for rank, ops in programs.items():
            while pos[rank] < len(ops):
                op = ops[pos[rank]]
                if op.peer in programs:
                    if op.kind == "send":
                        channels.setdefault((rank, op.peer), deque()).append(op)
                    else:
                        queue = channels.get((op.peer, rank))
                        if not queue:
                            break
                        queue.popleft()
                pos[rank] += 1
                progress = True
    return _stalled(programs, pos) + _unreceived(programs, pos, channels)


def _stalled(programs: Mapping[int, Sequence[Op]], pos: Dict[int, int]) -> List[Problem]:
    problems = []
    for rank, ops in programs.items():
        if pos[rank] == len(ops):
            continue
        op = ops[pos[rank]]
        peer_ops = programs[op.peer]
        if pos[op.peer] == len(peer_ops):
            why = f"rank {op.peer} finishes its forward without sending to rank {rank} again"
        else:
            why = f"rank {op.peer} is itself blocked: {_blocked(op.peer, programs, pos)}"
        problems.append(Problem(rank, op, f"{op.describe(rank)}, which never arrives: {why}"))
    return problems


def _blocked(rank: int, programs: Mapping[int, Sequence[Op]], pos: Dict[int, int]) -> str:
    return programs[rank][pos[rank]].describe(rank)


def _unreceived(programs: Mapping[int, Sequence[Op]], pos: Dict[int, int],
                channels: Dict[Tuple[int, int], Deque[Op]]) -> List[Problem]:
    problems = []
    for (src, dst), queue in sorted(channels.items()):
        for op in queue:
            if pos[dst] == len(programs[dst]):
                why = f"rank {dst} finishes its forward without receiving from rank {src} again"
            else:
                why = f"rank {dst} is blocked: {_blocked(dst, programs, pos)}"
            problems.append(Problem(src, op, f"{op.describe(src)}, which is never received: "
                                             f"{why}"))
    return problems


def report(problems: Sequence[Problem], programs: Mapping[int, Sequence[Op]],
           size: int) -> str:
    """A WiringError message: the problems, then every known rank's program."""
    lines = ["the MultiNodeChainList wiring of the ranks does not match; running it would "
             "hang:"]
    lines += [f"  - {p.reason}" for p in problems]
    lines.append("wiring (forward order of sends and receives):")
    for rank in range(size):
        if rank in programs:
            ops = ", ".join(f"{op.kind} {op.peer}" for op in programs[rank]) or "nothing"
            lines.append(f"  rank {rank}: {ops}")
        else:
            lines.append(f"  rank {rank}: not checked (outside this model, not there yet, or "
                         f"with traffic its model does not show)")
    return "\n".join(lines)
