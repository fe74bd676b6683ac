"""Schedules as data: ``plan`` makes every rank's action list, proves it, and predicts.

A schedule is, per rank, the list of actions it runs; four modules make one,
each around one idea, and this one joins them::

    _actions    the vocabulary: Action (component, micro-batch, F | B | W),
                what an action waits for, what it costs on the clock
    _rules      one rule per schedule, in one table: its phases, how many
                micro-batches in flight, where W goes, the backwards' order
    _generate   list scheduling on a simulated clock, by a rule, within the
                ranks' memory budgets
    _proof      simulate (every send meets its receive), table, the clock's
                makespan, the peak of live activations

``plan`` runs them in that order and returns a ``Plan``: the lists, which
components' backwards it splits (worked out once, here, for everyone who
runs or measures the plan), and its predictions. The other names are
re-exported for the modules and tests that import them from here.
"""
from typing import Dict, FrozenSet, List, Optional

from ._actions import (  # noqa: F401 (re-exported)
    Action,
    Costs,
    Schedule,
    ScheduleError,
    action_cost,
    component_costs,
    dependencies,
)
from ._generate import (  # noqa: F401 (re-exported)
    Memory,
    budgets,
    generate,
    schedule_lists,
    scheduled,
)
from ._graph import Graph, Node
from ._proof import (  # noqa: F401 (re-exported)
    Delay,
    finish_times,
    makespan,
    peak_activations,
    simulate,
    table,
)
from ._rules import (  # noqa: F401 (re-exported)
    SCHEDULES,
    SPLIT_SCHEDULES,
    TRAINING_SCHEDULES,
    check_schedule,
    rule_of,
    split_components,
)


class Plan(Dict[int, List[Action]]):
    """A proven schedule (rank -> actions) with what it predicts.

    Attributes:
        split: the components (rank, index) whose backward runs as B and W.
        peak_activations: rank -> the most micro-batch segments (a
            component's activations for one micro-batch) alive at once;
            within ``memory`` where one was given.
        makespan: the clock's length of the step, in ``costs``' ticks.
        memory: rank -> its budget in segments (ranks without one left out).
    """

    split: FrozenSet[Node]
    peak_activations: Dict[int, int]
    makespan: int
    memory: Dict[int, int]


def plan(graph: Graph, n_microbatches: int, kind: str, costs: Optional[Costs] = None,
         memory: Memory = None) -> Plan:
    """``generate``, proven by ``simulate`` before it is returned, with its predictions.

    Args:
        graph: the component graph.
        n_microbatches: micro-batches per mini-batch (at least 1).
        kind: one of ``SCHEDULES``.
        costs: as for ``generate``.
        memory: the most segments of activations (one component's, for one
            micro-batch) a rank keeps at once: an int for every rank, or
            rank -> int; None: the schedule's own bounds only. A rank needs
            at least one per component it holds (``'gpipe'``: one per
            component and micro-batch).

    Raises:
        ValueError: a budget too small for its rank (the message names it).
        ScheduleError: as for ``generate``.

    Example::

        v = plan(graph, 8, "zb1", memory=4)    # at most 4 segments per rank
        v.peak_activations, v.makespan         # {0: 4, 1: 4}, 49
    """
    lists, split, budget = scheduled(graph, n_microbatches, kind, costs, memory)
    proven = Plan(lists)
    proven.split = split
    proven.memory = budget
    simulate(graph, proven, n_microbatches)
    proven.peak_activations = peak_activations(graph, proven)
    proven.makespan = makespan(graph, proven, costs)
    assert all(proven.peak_activations[r] <= b for r, b in budget.items()), (
        proven.peak_activations, budget)
    return proven
