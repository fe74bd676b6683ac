"""Schedules as data: per rank, the list of actions it runs, and their proof.

An action is ``(component, micro-batch, forward|backward)``. ``generate``
makes every rank's list by list scheduling on a simulated clock: whenever a
rank is free it starts the best action whose inputs are ready, by the
schedule's rule. A forward costs 1 and a backward 2, unless ``costs`` gives
each component its own (``component_costs``: in proportion to its
parameters, so a component without any, such as the loss of the seed MLP's
loop, costs almost nothing and is never queued behind a heavy one):

=========  ============================================================
gpipe      every forward first, in clock order (micro-batch k reaches
           depth d at clock k + d); then the backwards, latest first
1f1b       a forward while the rank has fewer than S - d micro-batches
           in flight (S stages: the longest path of components; d: the
           rank's depth), else a backward: warm-up forwards, then forwards
           and backwards alternate, and live activations stay within S
forward    forwards only, in clock order (evaluation)
=========  ============================================================

``simulate`` then runs all ranks' lists together, one action per rank per
step, receives blocking and sends buffered, and raises ``ScheduleError`` if
some action can never run; its steps print as a table (``table``)::

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
"""
from typing import Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

from .._errors import WiringError
from ._graph import Graph, Node

SCHEDULES = ("gpipe", "1f1b", "forward")
TRAINING_SCHEDULES = SCHEDULES[:2]  # what PipelineUpdater runs; "forward" evaluates
_COST = {False: 1, True: 2}  # forward, backward


def check_schedule(kind: str, allowed: Tuple[str, ...] = SCHEDULES) -> str:
    """Raises ValueError unless ``kind`` is one of ``allowed``; the one check of a name."""
    if kind not in allowed:
        raise ValueError(f"schedule={kind!r} is not one of {allowed}")
    return kind


class ScheduleError(WiringError):
    """A schedule in which some send never meets its receive."""


class Action(NamedTuple):
    """One graph segment: component ``component`` on micro-batch ``microbatch``."""

    component: int
    microbatch: int
    backward: bool

    def label(self, single: bool) -> str:
        """``F3`` / ``B3``, with ``.c1`` appended unless the rank has one component."""
        text = f"{'B' if self.backward else 'F'}{self.microbatch}"
        return text if single else f"{text}.c{self.component}"


Schedule = Dict[int, List[Action]]
_Key = Tuple[int, int, bool]  # (rank, component, backward) with the micro-batch below


def _actions(graph: Graph, rank: int, n_microbatches: int, forward_only: bool) -> Set[Action]:
    """Every action ``rank`` runs in a step, once each."""
    return {Action(c, k, b) for c in graph.components(rank) for k in range(n_microbatches)
            for b in ((False,) if forward_only else (False, True))}


def dependencies(graph: Graph, rank: int, action: Action) -> List[Tuple[int, Action]]:
    """The actions (rank, action) whose results ``action`` needs."""
    node: Node = (rank, action.component)
    k = action.microbatch
    if not action.backward:
        return [(e.src[0], Action(e.src[1], k, False)) for e in graph.ins[node]]
    return [(rank, Action(action.component, k, False))] + [
        (e.dst[0], Action(e.dst[1], k, True)) for e in graph.outs[node]]


Costs = Dict[Node, Tuple[int, int]]  # a component's forward and backward, in clock ticks


def component_costs(graph: Graph, sizes: Dict[Node, int], scale: int = 20) -> Costs:
    """Clock costs in proportion to each component's parameter count (``sizes``).

    The largest component's forward costs ``scale`` ticks; every forward at
    least 1; a backward twice its forward. Parameter counts are the same on
    every rank, so every rank derives the same costs and the same schedule.
    """
    largest = max(sizes.values(), default=0)
    costs: Costs = {}
    for node in graph.nodes():
        forward = max(1, round(scale * sizes.get(node, 0) / largest)) if largest else 1
        costs[node] = (forward, 2 * forward)
    return costs


def generate(graph: Graph, n_microbatches: int, kind: str,
             costs: Optional[Costs] = None) -> Schedule:
    """Every rank's action list for ``n_microbatches`` micro-batches.

    Args:
        graph: the component graph.
        n_microbatches: micro-batches per mini-batch (at least 1).
        kind: ``'gpipe'``, ``'1f1b'`` or ``'forward'`` (evaluation).
        costs: each component's forward and backward cost in clock ticks
            (positive ints); None: 1 and 2 for every component.

    Returns:
        rank -> its actions in order.
    """
    check_schedule(kind)

    def cost(rank: int, action: Action) -> int:
        if costs is None:
            return _COST[action.backward]
        return costs[(rank, action.component)][action.backward]
    todo = {r: _actions(graph, r, n_microbatches, kind == "forward") for r in graph.ranks}
    done: Dict[Tuple[int, Action], int] = {}  # -> finish time
    busy_until = {r: 0 for r in graph.ranks}
    lists: Schedule = {r: [] for r in graph.ranks}
    stages = max(graph.depth.values(), default=0) + 1
    # As in 1F1B on a chain, a rank at depth d keeps at most S - d micro-batches.
    limits = {r: stages - min((graph.depth[(r, c)] for c in graph.components(r)), default=0)
              for r in graph.ranks}
    clock = 0
    while any(todo.values()):
        started = False
        for rank in graph.ranks:
            if busy_until[rank] > clock or not todo[rank]:
                continue
            ready = [a for a in todo[rank]
                     if all(done.get(d, clock + 1) <= clock
                            for d in dependencies(graph, rank, a))]
            choice = _choose(graph, rank, kind, ready, todo[rank], lists[rank], limits[rank])
            if choice is None:
                continue
            todo[rank].discard(choice)
            lists[rank].append(choice)
            busy_until[rank] = clock + cost(rank, choice)
            done[(rank, choice)] = busy_until[rank]
            started = True
        if not started and all(b <= clock for b in busy_until.values()):
            # Nothing can start under the bounds: a graph that needs more in flight.
            limits = {r: n + 1 for r, n in limits.items()}
            continue
        # Nothing changes before the next action ends: jump there.
        clock = min((b for b in busy_until.values() if b > clock), default=clock + 1)
    return lists


def _choose(graph: Graph, rank: int, kind: str, ready: List[Action], todo: Set[Action],
            history: List[Action], limit: int) -> Optional[Action]:
    forwards = [a for a in ready if not a.backward]
    backwards = [a for a in ready if a.backward]

    def clock(a: Action) -> Tuple[int, int, int, int]:
        # Actions that feed another rank go first: they keep that rank busy.
        d = graph.depth[(rank, a.component)]
        return (int(not _feeds_other_rank(graph, rank, a)), a.microbatch + d, d, a.component)

    def reverse_clock(a: Action) -> Tuple[int, int, int, int]:
        d = graph.depth[(rank, a.component)]
        return (int(not _feeds_other_rank(graph, rank, a)), -a.microbatch - d, -d, a.component)

    if kind == "gpipe":
        if forwards:
            return min(forwards, key=clock)
        if any(not a.backward for a in todo):
            return None
        return min(backwards, key=reverse_clock) if backwards else None
    if kind == "forward":
        return min(forwards, key=clock) if forwards else None
    n_components = len(graph.components(rank))
    opened = {a.microbatch for a in history if not a.backward}
    closed = {k for k in opened
              if sum(1 for a in history if a.backward and a.microbatch == k) == n_components}
    in_flight = opened - closed
    allowed = [a for a in forwards if a.microbatch in in_flight or len(in_flight) < limit]
    if allowed:
        return min(allowed, key=clock)
    if backwards:  # the oldest first, but one another rank waits for before any
        return min(backwards, key=lambda a: (reverse_clock(a)[0], a.microbatch,
                                             reverse_clock(a)))
    return None


def _feeds_other_rank(graph: Graph, rank: int, action: Action) -> bool:
    node = (rank, action.component)
    if action.backward:
        return any(not e.local for e in graph.ins[node])
    return any(not e.local for e in graph.outs[node])


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
    for rank in graph.ranks:
        want = _actions(graph, rank, n_microbatches, forward_only)
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
    """The steps as a step-by-rank table, one line per step."""
    single = {r: len(graph.components(r)) == 1 for r in graph.ranks}
    rows = [[str(i)] + [s[r].label(single[r]) if r in s else "" for r in graph.ranks]
            for i, s in enumerate(steps)]
    head = ["step"] + [f"rank{r}" for r in graph.ranks]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip()
                     for line in [head] + rows)


def plan(graph: Graph, n_microbatches: int, kind: str,
         costs: Optional[Costs] = None) -> Schedule:
    """``generate``, proven by ``simulate`` before it is returned."""
    schedule = generate(graph, n_microbatches, kind, costs)
    simulate(graph, schedule, n_microbatches)
    return schedule
