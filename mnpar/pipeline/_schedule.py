"""Schedules as data: per rank, the list of actions it runs, and their proof.

An action is ``(component, micro-batch, phase)``: F (forward), B (backward)
and, in the zero-bubble schedules, W. There a backward is split in two: B
computes the gradient of the component's inputs, which the rank before it
waits for, and W the gradient of its weights, which nobody waits for, so W
actions fill the time a rank would otherwise wait (Qi et al., "Zero Bubble
Pipeline Parallelism", 2024). A component is split when it receives from
another component and has parameters; the others keep one B.

``generate`` makes every rank's list by list scheduling on a simulated
clock: whenever a rank is free it starts the best action whose inputs are
ready, by the schedule's rule. A forward costs 1, a whole backward 2 (B and
W 1 each), unless ``costs`` gives each component its own
(``component_costs``: in proportion to its parameters, so a component
without any, such as the loss of the seed MLP's loop, costs almost nothing
and is never queued behind a heavy one). S is the number of stages (the
longest path of components), d a rank's depth (its first component's):

=========  ============================================================
gpipe      every forward first, in clock order (micro-batch k reaches
           depth d at clock k + d); then the backwards, latest first
1f1b       a forward while the rank has fewer than S - d micro-batches
           in flight (S stages: the longest path of components; d: the
           rank's depth), else a backward: warm-up forwards, then forwards
           and backwards alternate, and live activations stay within S
zb1        1f1b's rule for F and B (fewer than S - d micro-batches
           between F and B), W whenever nothing else is ready, and at most
           S micro-batches between F and W (1f1b's peak, on its first
           rank): ZB-H1
zb2        the same with 2(S - d) - 1 and 2S - 1: more forwards fill the
           start, W actions the rest (ZB-H2's memory)
forward    forwards only, in clock order (evaluation)
=========  ============================================================

The bounds on micro-batches in flight are kept: a graph that could not run
within them is a ``ScheduleError`` that says what to change (none of the
tests' graphs, nor 3,000 random ones, is such a graph). ``plan`` reports
every rank's predicted peak of live activations (``Plan.peak_activations``)
and the clock's makespan.

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
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

from .._errors import WiringError
from ._graph import Graph, Node

SCHEDULES = ("gpipe", "1f1b", "zb1", "zb2", "forward")
TRAINING_SCHEDULES = SCHEDULES[:4]  # what PipelineUpdater runs; "forward" evaluates
SPLIT_SCHEDULES = ("zb1", "zb2")  # B and W apart


def check_schedule(kind: str, allowed: Tuple[str, ...] = SCHEDULES) -> str:
    """Raises ValueError unless ``kind`` is one of ``allowed``; the one check of a name."""
    if kind not in allowed:
        raise ValueError(f"schedule={kind!r} is not one of {allowed}")
    return kind


class ScheduleError(WiringError):
    """A schedule in which some send never meets its receive."""


class Action(NamedTuple):
    """One graph segment: component ``component`` on micro-batch ``microbatch``.

    ``backward`` with ``weight`` is a W action: the weight gradients of a
    split backward, whose B computed the input gradients.
    """

    component: int
    microbatch: int
    backward: bool
    weight: bool = False

    @property
    def phase(self) -> str:
        return "W" if self.weight else "B" if self.backward else "F"

    def label(self, single: bool) -> str:
        """``F3`` / ``B3`` / ``W3``, with ``.c1`` appended unless the rank has one component."""
        text = f"{self.phase}{self.microbatch}"
        return text if single else f"{text}.c{self.component}"


Schedule = Dict[int, List[Action]]
# A component's forward and backward in clock ticks, or forward, B and W (W 0: not split).
Costs = Dict[Node, Tuple[int, ...]]


class Plan(Dict[int, List[Action]]):
    """A proven schedule (rank -> actions) with what it predicts.

    Attributes:
        peak_activations: rank -> the most micro-batch segments (a
            component's activations for one micro-batch) alive at once.
        makespan: the clock's length of the step, in ``costs``' ticks.
    """

    peak_activations: Dict[int, int]
    makespan: int


def split_components(graph: Graph, kind: str, costs: Optional[Costs] = None) -> Set[Node]:
    """The components whose backward runs as B and W under ``kind``.

    Those that receive from another component (their B has inputs to compute
    a gradient for) and have parameters (costs without a W part have none).
    """
    if kind not in SPLIT_SCHEDULES:
        return set()
    return {n for n in graph.nodes() if graph.ins[n]
            and (costs is None or (len(costs[n]) > 2 and costs[n][2] > 0))}


def _actions(graph: Graph, rank: int, n_microbatches: int, forward_only: bool,
             split: Set[Node]) -> Set[Action]:
    """Every action ``rank`` runs in a step, once each."""
    phases = [(False, False)] if forward_only else [(False, False), (True, False)]
    return {Action(c, k, b, w) for c in graph.components(rank) for k in range(n_microbatches)
            for b, w in phases + ([(True, True)] if (rank, c) in split else [])}


def dependencies(graph: Graph, rank: int, action: Action) -> List[Tuple[int, Action]]:
    """The actions (rank, action) whose results ``action`` needs."""
    node: Node = (rank, action.component)
    k = action.microbatch
    if action.weight:
        return [(rank, Action(action.component, k, True))]
    if not action.backward:
        return [(e.src[0], Action(e.src[1], k, False)) for e in graph.ins[node]]
    return [(rank, Action(action.component, k, False))] + [
        (e.dst[0], Action(e.dst[1], k, True)) for e in graph.outs[node]]


def action_cost(costs: Optional[Costs], rank: int, action: Action, split: Set[Node]) -> int:
    """What ``action`` costs on the clock: a B without its W costs both."""
    node = (rank, action.component)
    cost = (1, 1, 1) if costs is None else costs[node]
    if len(cost) == 2:  # forward, whole backward: B and W half each
        cost = (cost[0], cost[1] - cost[1] // 2, cost[1] // 2)
    if not action.backward:
        return cost[0]
    if action.weight:
        return cost[2]
    return cost[1] if node in split else cost[1] + cost[2]


def component_costs(graph: Graph, sizes: Dict[Node, int], scale: int = 20) -> Costs:
    """Clock costs in proportion to each component's parameter count (``sizes``).

    The largest component's forward costs ``scale`` ticks; every forward at
    least 1; B and W each as much as the forward, a whole backward twice
    it; a component without parameters has no W (its B costs twice its
    forward). Parameter counts are the same on every rank, so every rank
    derives the same costs and the same schedule.
    """
    largest = max(sizes.values(), default=0)
    costs: Costs = {}
    for node in graph.nodes():
        forward = max(1, round(scale * sizes.get(node, 0) / largest)) if largest else 1
        costs[node] = (forward, forward, forward) if sizes.get(node, 0) else (
            forward, 2 * forward, 0)
    return costs


def generate(graph: Graph, n_microbatches: int, kind: str,
             costs: Optional[Costs] = None) -> Schedule:
    """Every rank's action list for ``n_microbatches`` micro-batches.

    Args:
        graph: the component graph.
        n_microbatches: micro-batches per mini-batch (at least 1).
        kind: one of ``SCHEDULES``.
        costs: each component's forward and backward cost in clock ticks
            (positive ints), or forward, B and W; None: 1 each (a whole
            backward 2).

    Returns:
        rank -> its actions in order.

    Raises:
        ScheduleError: the graph cannot run within the schedule's bound on
            micro-batches in flight (the message names the ranks and what
            they wait for); no graph of the tests does, but the bound is
            never raised silently.
    """
    check_schedule(kind)
    split = split_components(graph, kind, costs)
    todo = {r: _actions(graph, r, n_microbatches, kind == "forward", split)
            for r in graph.ranks}
    done: Dict[Tuple[int, Action], int] = {}  # -> finish time
    busy_until = {r: 0 for r in graph.ranks}
    lists: Schedule = {r: [] for r in graph.ranks}
    limits = _limits(graph, kind)
    clock = 0
    while any(todo.values()):
        started = False
        for rank in graph.ranks:
            if busy_until[rank] > clock or not todo[rank]:
                continue
            ready = [a for a in todo[rank]
                     if all(done.get(d, clock + 1) <= clock
                            for d in dependencies(graph, rank, a))]
            choice = _choose(graph, rank, kind, ready, todo[rank], lists[rank], limits, split)
            if choice is None:
                continue
            todo[rank].discard(choice)
            lists[rank].append(choice)
            busy_until[rank] = clock + action_cost(costs, rank, choice, split)
            done[(rank, choice)] = busy_until[rank]
            started = True
        if not started and all(b <= clock for b in busy_until.values()):
            raise ScheduleError(_over_bound(graph, kind, limits, todo))
        # Nothing changes before the next action ends: jump there.
        clock = min((b for b in busy_until.values() if b > clock), default=clock + 1)
    return lists


def _over_bound(graph: Graph, kind: str, limits: Dict[int, Tuple[int, int]],
                todo: Dict[int, Set[Action]]) -> str:
    waiting = {r: sorted(a.label(False) for a in acts)[:3] for r, acts in todo.items() if acts}
    return (f"schedule {kind!r} cannot run this graph within its bound on micro-batches in "
            f"flight per component (depth -> before B, before the last W: {limits}); "
            f"actions left: {waiting}. Use schedule='gpipe', which keeps every micro-batch, "
            "or wire the components so that each rank's run at nearby depths (Graph.depth)")


def _limits(graph: Graph, kind: str) -> Dict[int, Tuple[int, int]]:
    """Per depth d: segments of a component allowed between F and B, and between F
    and its last backward action.

    As in 1F1B on a chain, a component at depth d of S keeps at most S - d
    micro-batches before their B; zb1 lets W wait while at most S are alive,
    zb2 doubles both (ZB-H2's memory). gpipe and forward keep them all.
    """
    stages = max(graph.depth.values(), default=0) + 1
    limits = {}
    for d in range(stages):
        first = stages - d
        limits[d] = {"zb1": (first, max(first, stages)),
                     "zb2": (2 * first - 1, max(2 * first - 1, 2 * stages - 1))}.get(
            kind, (first, first))
    return limits


def _choose(graph: Graph, rank: int, kind: str, ready: List[Action], todo: Set[Action],
            history: List[Action], limits: Dict[int, Tuple[int, int]],
            split: Set[Node]) -> Optional[Action]:
    forwards = [a for a in ready if not a.backward]
    backwards = [a for a in ready if a.backward and not a.weight]
    weights = [a for a in ready if a.weight]

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
    # Per component, as 1F1B on a chain: a segment (component, micro-batch) is
    # past B once its B ran, and freed once its last backward action ran (W
    # where split); a forward may start while both counts are under the bounds.
    started = {(a.component, a.microbatch) for a in history if not a.backward}
    past_b = {(a.component, a.microbatch) for a in history if a.backward and not a.weight}
    freed = {(a.component, a.microbatch) for a in history
             if a.backward and (a.weight or (rank, a.component) not in split)}

    def fits(a: Action) -> bool:
        before_b, alive = limits[graph.depth[(rank, a.component)]]
        mine = [s for s in started if s[0] == a.component]
        return (sum(1 for s in mine if s not in past_b) < before_b
                and sum(1 for s in mine if s not in freed) < alive)
    allowed = [a for a in forwards if fits(a)]
    if allowed:
        return min(allowed, key=clock)
    if backwards:  # the oldest first, but one another rank waits for before any
        return min(backwards, key=lambda a: (reverse_clock(a)[0], a.microbatch,
                                             reverse_clock(a)))
    if weights:
        return min(weights, key=lambda a: (a.microbatch, a.component))
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
    split = {(r, a.component) for r, acts in schedule.items() for a in acts if a.weight}
    for rank in graph.ranks:
        want = _actions(graph, rank, n_microbatches, forward_only, split)
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
    peaks = {}
    for rank, actions in schedule.items():
        split = {a.component for a in actions if a.weight}
        alive = peak = 0
        for a in actions:
            if not a.backward:
                alive += 1
            elif a.weight or a.component not in split:
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
    split = {(r, a.component) for r, acts in schedule.items() for a in acts if a.weight}
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


def plan(graph: Graph, n_microbatches: int, kind: str,
         costs: Optional[Costs] = None) -> Plan:
    """``generate``, proven by ``simulate`` before it is returned, with its predictions."""
    schedule = generate(graph, n_microbatches, kind, costs)
    simulate(graph, schedule, n_microbatches)
    proven = Plan(schedule)
    proven.peak_activations = peak_activations(graph, schedule)
    proven.makespan = makespan(graph, schedule, costs)
    return proven
