"""The wiring of MultiNodeChainLists: one model shared by links and pipeline.

Each rank's model is a list of components, each with the ranks it receives
from and sends to (a ``Wire``); a rank's ``Wiring`` is that list. In forward
a component does one receive per rank of ``rank_in``, then one send per rank
of ``rank_out``: a *program* of ``Op``s (a rank's own rank goes through a
local queue instead, so it is left out)::

    rank 0: add_link(A, None, 1); add_link(B, 1, None)   ->  send 1, recv 1
    rank 1: add_link(C, 0, 0)                            ->  recv 0, send 0

Messages between two ranks match first in first out, as MPI's do on one tag
and as the local queue does: the k-th send from ``s`` to ``d`` meets the k-th
receive on ``d`` from ``s``. ``messages`` names each op's message that way;
it is the only matching rule, used here, by ``_wiring_match`` and by the
pipeline's component graph, which joins every rank's wiring into edges.

``hangs`` runs the programs of the ranks it knows together, with sends
buffered (they never wait) and receives blocking, and returns the wiring
errors: a receive that can never be satisfied, or a send that no one
receives. Ranks whose program is unknown are wildcards: they are assumed to
send and receive whatever the known ranks need, so the check never rejects a
program merely because it cannot see all of it. Backward runs every program
in reverse with the directions swapped; its graph of waits is the forward
graph reversed, so a forward that cannot deadlock gives a backward that
cannot either.

Pure Python, no MPI: unit-tested in one process.
"""
from collections import Counter
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from .._errors import WiringError

Ranks = Optional[Tuple[int, ...]]  # rank_in or rank_out of a component; None: the model's
Message = Tuple[int, int, int]  # (src, dst, k): the k-th message from rank src to rank dst


class Wire(NamedTuple):
    """One component's ranks: where its inputs come from, where its outputs go."""

    rank_in: Ranks  # None: the model's inputs
    rank_out: Ranks  # None: the model's output


Wiring = Tuple[Wire, ...]  # a rank's components, in the order they were added


def as_wiring(pairs: Iterable[Tuple[Ranks, Ranks]]) -> Wiring:
    """``(rank_in, rank_out)`` pairs, their ranks in any sequences, as a ``Wiring``."""
    return tuple(Wire(*(None if r is None else tuple(map(int, r)) for r in p)) for p in pairs)


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


def messages(rank: int, ops: Iterable[Op]) -> List[Message]:
    """The message each of ``rank``'s ops sends or receives: first in first out per pair."""
    seen: Counter = Counter()
    names = []
    for op in ops:
        pair = (rank, op.peer) if op.kind == "send" else (op.peer, rank)
        names.append((*pair, seen[op.kind, pair]))
        seen[op.kind, pair] += 1
    return names


def operations(rank: int, wiring: Sequence[Tuple[Ranks, Ranks]]) -> List[Tuple[Op, int, Message]]:
    """Every receive and send of ``rank``'s components in forward order, self included,
    with its place in the component's ``rank_in`` or ``rank_out`` and its message."""
    ops: List[Tuple[Op, int]] = []
    for i, (rank_in, rank_out) in enumerate(wiring):
        ops += [(Op("recv", r, i), place) for place, r in enumerate(rank_in or ())]
        ops += [(Op("send", r, i), place) for place, r in enumerate(rank_out or ())]
    return [(op, place, m) for (op, place), m in zip(ops, messages(rank, [op for op, _ in ops]))]


def program(rank: int, wiring: Sequence[Tuple[Ranks, Ranks]]) -> List[Op]:
    """The sends and receives of one rank's components to other ranks, in forward order."""
    return [op for op, _, _ in operations(rank, wiring) if op.peer != rank]


def check_self_sends(rank: int, wiring: Sequence[Tuple[Ranks, Ranks]]) -> None:
    """Raises WiringError unless every receive from this rank follows a send to it
    and every send to it is received.
    """
    queued: Dict[Message, int] = {}  # sent, not yet received -> sending component
    for op, _, message in operations(rank, wiring):
        if op.peer != rank:
            continue
        if op.kind == "send":
            queued[message] = op.component
        elif queued.pop(message, None) is None:
            raise WiringError(
                f"rank {rank} component {op.component} has "
                f"rank_in={list(wiring[op.component][0] or ())} and so receives from its own "
                f"rank {rank}, but no earlier component sends to rank {rank} (add it to an "
                f"earlier rank_out)")
    if queued:
        raise WiringError(
            f"rank {rank} component {next(iter(queued.values()))} sends to its own rank "
            f"{rank} (rank_out), but no later component receives it (add rank {rank} to a "
            f"later rank_in)")


def hangs(programs: Mapping[int, Sequence[Op]]) -> List[Problem]:
    """Runs the known ranks' forward programs together; returns what can never complete.

    Not ``mnpar.pipeline.simulate``: that one checks a pipeline schedule of
    actions against the component graph, whose messages are told apart by
    tag, so it only asks whether each action's inputs were made before it.
    Here a MultiNodeChainList's forward runs its sends and receives in
    program order on one tag, so the order of messages between two ranks
    decides whether they meet.

    Args:
        programs: rank -> its ops, for every rank whose program is known.

    Returns:
        The problems, empty when every send meets a receive and no rank waits
        forever. A receive or send involving an unknown rank always succeeds.
    """
    names = {r: messages(r, ops) for r, ops in programs.items()}
    pos = {r: 0 for r in programs}
    sent: Dict[Message, Op] = {}  # sent, not yet received
    progress = True
    while progress:
        progress = False
        for rank, ops in programs.items():
            while pos[rank] < len(ops):
                op, message = ops[pos[rank]], names[rank][pos[rank]]
                if op.peer in programs:
                    if op.kind == "send":
                        sent[message] = op
                    elif sent.pop(message, None) is None:
                        break
                pos[rank] += 1
                progress = True
    return _stalled(programs, pos) + _unreceived(programs, pos, sorted(sent.items()))


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
                unreceived: Sequence[Tuple[Message, Op]]) -> List[Problem]:
    problems = []
    for (src, dst, _), op in unreceived:
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
