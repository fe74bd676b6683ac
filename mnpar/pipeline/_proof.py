"""The proof of a schedule, and what it predicts: it runs to its end, how long, how much memory.

``simulate`` runs all ranks' lists together, one action per rank per step,
receives blocking and sends buffered, and raises ``ScheduleError`` if some
action can never run; its steps print as a table (``table``)::

    step  rank0  rank1  rank2        (1f1b, a 3-rank chain, 4 micro-batches)
    0     F0
    1     F1     F0
    2     F2     F1     F0
    3                   B0
    4            B0     F1
    5     B0     F2     B1
    6     F3     B1     F2

Because a rank's list is in the order of a run that completed, executing the
lists with non-blocking sends cannot deadlock, whatever the actions cost.
``finish_times`` replays the lists on a clock (each action as soon as its
rank is free and its inputs are there), which gives the ``makespan``;
``peak_activations`` counts the segments each rank keeps alive.
"""
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

from ._actions import (
    Action,
    Costs,
    Schedule,
    ScheduleError,
    action_cost,
    actions_of,
    dependencies,
    split_of,
)
from ._graph import Graph


def simulate(graph: Graph, schedule: Schedule,
             n_microbatches: int) -> List[Dict[int, Action]]:
    """Runs every rank's list together, one action per rank per step.

    Not the links' ``_wiring.hangs``, which runs a MultiNodeChainList's
    forward sends and receives, matched first in first out on one tag: here
    every message has its own tag (edge, micro-batch, direction), so an
    action runs once the actions it depends on have run, whatever their order.

    Returns:
        The steps: for each, rank -> the action it ran.

    Raises:
        ScheduleError: an action is missing or repeated, or some action can
            never run (its input never comes, or ranks wait for each other).
    """
    forward_only = not any(a.backward for acts in schedule.values() for a in acts)
    split = split_of(schedule)
    for rank in graph.ranks:
        want = actions_of(graph, rank, n_microbatches, forward_only, split)
        have = schedule.get(rank, [])
        if len(have) != len(want) or set(have) != want:
            missing = sorted(want - set(have))
            raise ScheduleError(f"rank {rank}'s schedule must run each of its {len(want)} "
                                f"actions once; missing {missing[:4]}, "
                                f"{len(have) - len(set(have))} repeated")
    pos = {r: 0 for r in graph.ranks}
    ran: Set[Tuple[int, Action]] = set()
    steps: List[Dict[int, Action]] = []
    while any(pos[r] < len(schedule[r]) for r in graph.ranks):
        step = {}
        for rank in graph.ranks:
            if pos[rank] < len(schedule[rank]):
                action = schedule[rank][pos[rank]]
                if all(d in ran for d in dependencies(graph, rank, action)):
                    step[rank] = action
        if not step:
            raise ScheduleError(_stuck(graph, schedule, pos, ran))
        for rank, action in step.items():
            ran.add((rank, action))
            pos[rank] += 1
        steps.append(step)
    return steps


def _stuck(graph: Graph, schedule: Schedule, pos: Dict[int, int],
           ran: Set[Tuple[int, Action]]) -> str:
    lines = ["the pipeline schedule would hang:"]
    for rank in graph.ranks:
        if pos[rank] == len(schedule[rank]):
            continue
        action = schedule[rank][pos[rank]]
        missing = [d for d in dependencies(graph, rank, action) if d not in ran]
        waits = ", ".join(f"rank {r} {a.label(False)}" for r, a in missing)
        lines.append(f"  - rank {rank} {action.label(False)} waits for {waits}")
    return "\n".join(lines)


def table(graph: Graph, steps: Iterable[Dict[int, Action]]) -> str:
    """The steps as a step-by-rank table, one line per step.

    A rank that still has actions but waits for another rank's shows ``.``.
    """
    steps = list(steps)
    single = {r: len(graph.components(r)) == 1 for r in graph.ranks}
    last = {r: max((i for i, s in enumerate(steps) if r in s), default=-1) for r in graph.ranks}
    rows = [[str(i)] + [s[r].label(single[r]) if r in s else "." if i < last[r] else ""
                        for r in graph.ranks]
            for i, s in enumerate(steps)]
    head = ["step"] + [f"rank{r}" for r in graph.ranks]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip()
                     for line in [head] + rows)


def peak_activations(graph: Graph, schedule: Schedule) -> Dict[int, int]:
    """Per rank, the most micro-batch segments alive at once as its list runs.

    A segment (a component's activations for one micro-batch) lives from its
    F to its last backward action: W where the backward is split, else B.
    """
    split = split_of(schedule)
    peaks = {}
    for rank, actions in schedule.items():
        alive = peak = 0
        for a in actions:
            if not a.backward:
                alive += 1
            elif a.weight or (rank, a.component) not in split:
                alive -= 1
            peak = max(peak, alive)
        peaks[rank] = peak
    return peaks


# Seconds (or ticks) between a dependency's end and when ``action`` on ``rank`` can
# use it: a message's time on the link between the two ranks.
Delay = Callable[[Tuple[int, Action], int, Action], float]


def finish_times(graph: Graph, schedule: Schedule, costs: Optional[Costs] = None,
                 delay: Optional[Delay] = None) -> Dict[int, float]:
    """rank -> when its last action ends, every rank running its list in order, each
    action as soon as its rank is free and its inputs are there (``delay`` after
    the actions they come from; none by default)."""
    split = split_of(schedule)
    pos = {r: 0 for r in schedule}
    free = {r: 0.0 for r in schedule}
    end: Dict[Tuple[int, Action], float] = {}
    moved = True
    while moved:
        moved = False
        for r, actions in schedule.items():
            while pos[r] < len(actions):
                a = actions[pos[r]]
                deps = dependencies(graph, r, a)
                if not all(d in end for d in deps):
                    break
                start = max([free[r]] + [end[d] + (delay(d, r, a) if delay else 0)
                                         for d in deps])
                end[(r, a)] = free[r] = start + action_cost(costs, r, a, split)
                pos[r] += 1
                moved = True
    if any(pos[r] < len(actions) for r, actions in schedule.items()):
        raise ScheduleError("the schedule does not run to its end; simulate() says where")
    return free


def makespan(graph: Graph, schedule: Schedule, costs: Optional[Costs] = None) -> int:
    """When the last action ends (``finish_times``), messages taking no time."""
    return round(max(finish_times(graph, schedule, costs).values(), default=0))
