"""What a schedule is made of: actions, what each waits for, and what each costs.

An action is ``(component, micro-batch, phase)``: F (forward), B (backward)
and, where a schedule splits the backward, W. B then computes the gradient
of the component's inputs, which the rank before it waits for, and W the
gradient of its weights, which nobody waits for (Qi et al., "Zero Bubble
Pipeline Parallelism", 2024). A schedule is, per rank, the list of actions
it runs in order. The rules that order them (``_rules``), the list
scheduling that applies a rule (``_generate``) and the proof that the lists
cannot hang (``_proof``) all speak this vocabulary and nothing else.

What an action waits for, within one micro-batch k::

    F(c, k)   F(p, k) of each component p that feeds c
    B(c, k)   F(c, k), and B(q, k) of each component q that c feeds
    W(c, k)   B(c, k)

Costs are clock ticks on the schedule's simulated clock: per component a
forward and a whole backward, or a forward, B and W.
"""
from typing import AbstractSet, Dict, List, NamedTuple, Optional, Set, Tuple

from .._errors import WiringError
from ._graph import Graph, Node


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


def actions_of(graph: Graph, rank: int, n_microbatches: int, forward_only: bool,
               split: AbstractSet[Node]) -> Set[Action]:
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


def action_cost(costs: Optional[Costs], rank: int, action: Action,
                split: AbstractSet[Node]) -> int:
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


def feeds_other_rank(graph: Graph, rank: int, action: Action) -> bool:
    """Whether another rank waits for ``action``'s result (a message leaves the rank)."""
    node = (rank, action.component)
    if action.backward:
        return any(not e.local for e in graph.ins[node])
    return any(not e.local for e in graph.outs[node])


def split_of(schedule: Schedule) -> AbstractSet[Node]:
    """The components whose backward a schedule runs as B and W: a ``Plan``
    carries them; a plain schedule shows them by its W actions."""
    carried: Optional[AbstractSet[Node]] = getattr(schedule, "split", None)
    if carried is not None:
        return carried
    return {(r, a.component) for r, acts in schedule.items() for a in acts if a.weight}
