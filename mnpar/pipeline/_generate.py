"""Every rank's action list, by list scheduling on a simulated clock.

Whenever a rank is free it starts the best of its actions whose inputs are
ready, by its schedule's rule (``_rules``): a forward while the rule's
bounds and the rank's memory budget allow one, else a backward, else a W.
A forward costs 1, a whole backward 2 (B and W 1 each), unless ``costs``
gives each component its own (``component_costs``: in proportion to its
parameters, so a component without any, such as the loss of the seed
MLP's loop, costs almost nothing and is never queued behind a heavy one).
Among ready actions, those another rank waits for go first; then forwards
in clock order (micro-batch k reaches depth d at clock k + d), backwards
oldest (or, by the rule, latest) first.

The bounds are kept: a graph that could not run within them is a
``ScheduleError`` that says what to change (none of the tests' graphs, nor
3,000 random ones, is such a graph).

A memory budget counts *segments* (one component's activations for one
micro-batch, alive from its F to its last backward action), per rank. A
forward may start only if, afterwards, the micro-batches the rank holds can
still finish oldest first within the budget, each taking the segments it
has yet to start (the banker's algorithm), and a rank takes up new
micro-batches in order. So the oldest unfinished micro-batch can always go
on, on every rank, and a budget of at least a rank's number of components
never deadlocks::

    budget 4, V placement, rank 0 (chunks c0 and c3):
    F0.c0 F1.c0 F2.c0      3 held, micro-batch 0 still needs c3: 1 free
    F3.c0                  refused: 0 free, micro-batch 0 could not finish
    F0.c3 B0.c3 ...        the oldest finishes and frees its segments
"""
from collections import Counter
from typing import AbstractSet, Dict, FrozenSet, List, Mapping, NamedTuple, Optional, Tuple, Union

from ._actions import (
    Action,
    Costs,
    Schedule,
    ScheduleError,
    action_cost,
    actions_of,
    dependencies,
    feeds_other_rank,
)
from ._graph import Graph, Node
from ._rules import RULES, Rule, rule_of, split_components

# Segments of activations a rank may keep: one budget for every rank, or per rank.
Memory = Union[None, int, Mapping[int, int]]


def generate(graph: Graph, n_microbatches: int, kind: str, costs: Optional[Costs] = None,
             memory: Memory = None) -> Schedule:
    """Every rank's action list for ``n_microbatches`` micro-batches.

    Args:
        graph: the component graph.
        n_microbatches: micro-batches per mini-batch (at least 1).
        kind: one of ``SCHEDULES``.
        costs: each component's forward and backward cost in clock ticks
            (positive ints), or forward, B and W; None: 1 each (a whole
            backward 2).
        memory: the most segments (a component's activations for one
            micro-batch) a rank keeps at once: an int for every rank, or
            rank -> int (ranks left out: no budget); None: only the
            schedule's own bounds.

    Returns:
        rank -> its actions in order.

    Raises:
        ValueError: a budget too small for its rank (the message names it).
        ScheduleError: the graph cannot run within the schedule's bound on
            micro-batches in flight (the message names the ranks and what
            they wait for); no graph of the tests does, but the bound is
            never raised silently.
    """
    return scheduled(graph, n_microbatches, kind, costs, memory).lists


class Scheduled(NamedTuple):
    """``generate``'s lists and what they were made with, for ``plan``."""

    lists: Schedule
    split: FrozenSet[Node]  # the components whose backward runs as B and W
    budget: Dict[int, int]  # rank -> its budget in segments (ranks without one left out)


def scheduled(graph: Graph, n_microbatches: int, kind: str, costs: Optional[Costs],
              memory: Memory) -> Scheduled:
    """The rule, the split components and the budgets of ``kind`` (assembled here once),
    and the lists they give."""
    rule = rule_of(kind)
    split = frozenset(split_components(graph, kind, costs))
    budget = budgets(graph, n_microbatches, rule, memory)
    return Scheduled(schedule_lists(graph, n_microbatches, rule, costs, split, budget),
                     split, budget)


def budgets(graph: Graph, n_microbatches: int, rule: Rule, memory: Memory) -> Dict[int, int]:
    """rank -> its budget in segments (ranks without one left out), each checked.

    Evaluation keeps no segment, so a budget binds training schedules only.
    """
    if memory is None or not rule.trains:
        return {}
    given = dict(memory) if isinstance(memory, Mapping) else {r: memory for r in graph.ranks}
    for rank, budget in given.items():
        if rank not in graph.ranks:
            raise ValueError(f"memory={memory!r} names rank {rank}; the ranks are {graph.ranks}")
        if not isinstance(budget, int) or isinstance(budget, bool):
            raise TypeError(f"memory={memory!r}: rank {rank}'s budget must be an int (segments), "
                            f"not {type(budget).__name__}")
        components = len(graph.components(rank))
        if rule.in_flight is None and budget < components * n_microbatches:
            bounded = tuple(r.name for r in RULES if r.trains and r.in_flight is not None)
            raise ValueError(
                f"memory={memory!r}: rank {rank}'s budget ({budget}) is too small for "
                f"schedule={rule.name!r}, which keeps all {n_microbatches} micro-batches in "
                f"each of its {components} components; give it at least "
                f"{components * n_microbatches} segments, or use a schedule whose forwards wait "
                f"for memory: {bounded}")
        if budget < components:
            raise ValueError(
                f"memory={memory!r}: rank {rank}'s budget ({budget}) is too small: one "
                f"micro-batch may keep a segment in each of its {components} components at "
                f"once; give it at least {components} segments")
    return given


class _Rank:
    """One rank on the clock: what it has left, what it ran, what it holds."""

    def __init__(self, graph: Graph, rank: int, n_microbatches: int, rule: Rule,
                 split: AbstractSet[Node], budget: Optional[int]) -> None:
        self.rank = rank
        self.todo = actions_of(graph, rank, n_microbatches, not rule.trains, split)
        self.actions: List[Action] = []
        self.busy_until = 0
        self.forwards_left = sum(1 for a in self.todo if not a.backward)
        self.budget = budget
        self._graph = graph
        self._split = split
        self._limits = rule.limits(graph)
        self._before_b: Counter = Counter()  # component -> segments past F, not past B
        self._alive: Counter = Counter()  # component -> segments past F, not freed
        self._components = len(graph.components(rank))
        self._unstarted = [self._components] * n_microbatches  # forwards not yet run
        self._held = [0] * n_microbatches  # segments alive, per micro-batch
        self._live = 0
        self._admitted = 0  # micro-batches taken up, in order (with a budget)

    def fits(self, action: Action) -> bool:
        """Whether forward ``action`` may start: within the rule's bounds and the budget."""
        if self._limits is not None:
            before_b, alive = self._limits[self._graph.depth[(self.rank, action.component)]]
            if (self._before_b[action.component] >= before_b
                    or self._alive[action.component] >= alive):
                return False
        return self.budget is None or self._safe_after(action.microbatch)

    def _safe_after(self, k: int) -> bool:
        """Whether, after one more segment of micro-batch ``k``, the micro-batches held
        can still finish oldest first within the budget (the banker's algorithm)."""
        assert self.budget is not None
        if self._unstarted[k] == self._components and k != self._admitted:
            return False  # new micro-batches come in order
        free = self.budget - self._live - 1
        for j in range(max(self._admitted, k + 1)):
            need = self._unstarted[j] - (j == k)
            held = self._held[j] + (j == k)
            if need > free:
                return False
            free += held  # j finishes and frees all it held
        return True

    def run(self, action: Action, until: int) -> None:
        """Takes ``action`` off the list; the rank is busy until ``until``."""
        self.todo.discard(action)
        self.actions.append(action)
        self.busy_until = until
        c, k = action.component, action.microbatch
        if not action.backward:
            self.forwards_left -= 1
            if self._unstarted[k] == self._components:
                self._admitted += 1
            self._unstarted[k] -= 1
            self._before_b[c] += 1
            self._alive[c] += 1
            self._held[k] += 1
            self._live += 1
            return
        if not action.weight:
            self._before_b[c] -= 1
        if action.weight or (self.rank, c) not in self._split:
            self._alive[c] -= 1
            self._held[k] -= 1
            self._live -= 1


def schedule_lists(graph: Graph, n_microbatches: int, rule: Rule, costs: Optional[Costs],
                   split: AbstractSet[Node], budget: Mapping[int, int]) -> Schedule:
    """The list scheduler itself, on a rule, split components and budgets (``scheduled``)."""
    ranks = {r: _Rank(graph, r, n_microbatches, rule, split, budget.get(r))
             for r in graph.ranks}
    done: Dict[Tuple[int, Action], int] = {}  # -> finish time
    clock = 0
    while any(state.todo for state in ranks.values()):
        started = False
        for rank, state in ranks.items():
            if state.busy_until > clock or not state.todo:
                continue
            ready = [a for a in state.todo
                     if all(done.get(d, clock + 1) <= clock
                            for d in dependencies(graph, rank, a))]
            choice = _choose(graph, rule, state, ready)
            if choice is None:
                continue
            state.run(choice, clock + action_cost(costs, rank, choice, split))
            done[(rank, choice)] = state.busy_until
            started = True
        if not started and all(state.busy_until <= clock for state in ranks.values()):
            raise ScheduleError(_over_bound(graph, rule, ranks))
        # Nothing changes before the next action ends: jump there.
        clock = min((s.busy_until for s in ranks.values() if s.busy_until > clock),
                    default=clock + 1)
    return {r: state.actions for r, state in ranks.items()}


def _choose(graph: Graph, rule: Rule, state: _Rank, ready: List[Action]) -> Optional[Action]:
    """The action ``state``'s rank starts now by ``rule``, or None: it waits."""
    rank = state.rank
    forwards = [a for a in ready if not a.backward]
    backwards = [a for a in ready if a.backward and not a.weight]
    weights = [a for a in ready if a.weight]

    def clock(a: Action) -> Tuple[int, int, int, int]:
        # Actions that feed another rank go first: they keep that rank busy.
        d = graph.depth[(rank, a.component)]
        return (int(not feeds_other_rank(graph, rank, a)), a.microbatch + d, d, a.component)

    def latest(a: Action) -> Tuple[int, int, int, int]:
        d = graph.depth[(rank, a.component)]
        return (int(not feeds_other_rank(graph, rank, a)), -a.microbatch - d, -d, a.component)

    def oldest(a: Action) -> Tuple[int, int, Tuple[int, int, int, int]]:
        return (latest(a)[0], a.microbatch, latest(a))

    if rule.forwards_first:
        if forwards:
            return min(forwards, key=clock)
        if state.forwards_left:
            return None
    else:
        allowed = [a for a in forwards if state.fits(a)]
        if allowed:
            return min(allowed, key=clock)
    if backwards:
        if rule.backward_order == "latest":
            return min(backwards, key=latest)
        return min(backwards, key=oldest)
    if weights:
        return min(weights, key=lambda a: (a.microbatch, a.component))
    return None


def _over_bound(graph: Graph, rule: Rule, ranks: Dict[int, _Rank]) -> str:
    waiting = {r: sorted(a.label(False) for a in state.todo)[:3]
               for r, state in ranks.items() if state.todo}
    budget = {r: state.budget for r, state in ranks.items() if state.budget is not None}
    unbounded = [r.name for r in RULES if r.trains and r.in_flight is None]
    memory = f" and its memory budgets (rank -> segments: {budget})" if budget else ""
    return (f"schedule {rule.name!r} cannot run this graph within its bound on micro-batches "
            f"in flight per component (depth -> before B, before the last W: "
            f"{rule.limits(graph)}){memory}; actions left: {waiting}. Use "
            f"schedule={unbounded[0]!r}, which keeps every micro-batch, or wire the components "
            "so that each rank's run at nearby depths (Graph.depth)")
