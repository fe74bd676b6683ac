"""Schedules as rules: one row of one table per schedule, checked when mnpar is imported.

A schedule is named by what a free rank does next, not by code of its own:
its phases (and so whether the backward splits into B and W, and where W
goes), how many micro-batches it lets a component keep in flight, and the
order of its backwards. ``_generate`` applies any row with one list
scheduler; no other module compares a schedule's name. S is the number of
stages (the longest path of components), d a component's depth:

=========  ======  ============================  =============  ==================
schedule   phases  in flight per component       backward       ---
                   (before B; before the last    first
                   backward action)
=========  ======  ============================  =============  ==================
gpipe      F B     every micro-batch             latest         every F before
                                                                any B
1f1b       F B     S - d                         oldest
zb1        F B W   S - d; S                      oldest         ZB-H1
zb2        F B W   2(S - d) - 1; 2S - 1          oldest         ZB-H2
forward    F       every micro-batch             -              evaluation
=========  ======  ============================  =============  ==================

``phases`` lists the phases in the order a free rank prefers them: with
``FBW`` a rank runs a W only when no forward fits its bounds and no B is
ready, so W actions fill the time it would otherwise wait, and a W left
for later keeps its segment (activations and output gradients) alive,
which the second bound counts. A forward-only rule keeps nothing between
actions. Adding a schedule is adding a row; a row whose fields do not fit
together fails at import, and a name without a row fails at ``rule_of``.
"""
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Set, Tuple

from ._actions import Costs
from ._graph import Graph, Node

PHASES = ("F", "FB", "FBW")  # forward only; whole backward; backward split into B and W
BACKWARD_ORDERS = ("oldest", "latest")


class InFlight(NamedTuple):
    """How many micro-batches a component at depth d of S stages keeps.

    Between F and B: ``factor * (S - d) - (factor - 1)`` (1F1B's S - d at
    factor 1); between F and its last backward action (W where split): at
    least that, and ``factor * S - (factor - 1)``, the most 1F1B keeps on
    its first rank (ZB-H1), or about twice it (ZB-H2).
    """

    factor: int

    def limits(self, stages: int, depth: int) -> Tuple[int, int]:
        """(segments allowed before B, before the last backward action) at ``depth``."""
        before_b = self.factor * (stages - depth) - (self.factor - 1)
        return before_b, max(before_b, self.factor * stages - (self.factor - 1))


@dataclass(frozen=True)
class Rule:
    """How one schedule orders each rank's actions.

    Attributes:
        name: the schedule's name, as ``PipelineUpdater(schedule=...)`` takes it.
        phases: ``'F'`` (forwards only), ``'FB'`` (a whole backward) or
            ``'FBW'`` (B, then W when nothing else can run).
        in_flight: the bounds on segments per component, or None: every
            micro-batch may be in flight.
        forwards_first: every forward of a rank runs before its first backward.
        backward_order: which ready backward first, after those another rank
            waits for: the ``'oldest'`` micro-batch or the ``'latest'``.
    """

    name: str
    phases: str
    in_flight: Optional[InFlight] = None
    forwards_first: bool = False
    backward_order: str = "oldest"

    def __post_init__(self) -> None:
        problems = []
        if self.phases not in PHASES:
            problems.append(f"phases={self.phases!r} is not one of {PHASES}")
        if self.backward_order not in BACKWARD_ORDERS:
            problems.append(f"backward_order={self.backward_order!r} is not one of "
                            f"{BACKWARD_ORDERS}")
        if self.in_flight is not None and (not isinstance(self.in_flight, InFlight)
                                           or self.in_flight.factor < 1):
            problems.append(f"in_flight={self.in_flight!r} is not an InFlight of factor >= 1")
        if self.forwards_first and self.in_flight is not None:
            problems.append("forwards_first keeps every micro-batch: in_flight must be None")
        if self.phases == "F" and (self.forwards_first or self.in_flight is not None):
            problems.append("a forward-only rule keeps nothing: no in_flight, no "
                            "forwards_first")
        if problems:
            raise ValueError(f"schedule rule {self.name!r}: " + "; ".join(problems))

    @property
    def trains(self) -> bool:
        """Whether the schedule runs backwards (else it evaluates)."""
        return "B" in self.phases

    @property
    def splits(self) -> bool:
        """Whether a backward runs as B and W apart."""
        return "W" in self.phases

    def limits(self, graph: Graph) -> Optional[Dict[int, Tuple[int, int]]]:
        """Per depth, (segments allowed before B, before the last backward action);
        None where every micro-batch may be in flight."""
        if self.in_flight is None:
            return None
        stages = max(graph.depth.values(), default=0) + 1
        return {d: self.in_flight.limits(stages, d) for d in range(stages)}


RULES: Tuple[Rule, ...] = (
    Rule("gpipe", "FB", forwards_first=True, backward_order="latest"),
    Rule("1f1b", "FB", InFlight(1)),
    Rule("zb1", "FBW", InFlight(1)),
    Rule("zb2", "FBW", InFlight(2)),
    Rule("forward", "F"),
)


def _index(rules: Tuple[Rule, ...]) -> Dict[str, Rule]:
    """name -> rule; a name twice in the table is an error at import."""
    by_name: Dict[str, Rule] = {}
    for rule in rules:
        if rule.name in by_name:
            raise ValueError(f"schedule rule {rule.name!r} is in the table twice")
        by_name[rule.name] = rule
    return by_name


RULES_BY_NAME = _index(RULES)
SCHEDULES = tuple(rule.name for rule in RULES)
TRAINING_SCHEDULES = tuple(rule.name for rule in RULES if rule.trains)  # PipelineUpdater's
SPLIT_SCHEDULES = tuple(rule.name for rule in RULES if rule.splits)  # B and W apart


def check_schedule(kind: str, allowed: Tuple[str, ...] = SCHEDULES) -> str:
    """Raises ValueError unless ``kind`` is one of ``allowed``; the one check of a name."""
    if kind not in allowed:
        raise ValueError(f"schedule={kind!r} is not one of {allowed}")
    return kind


def rule_of(kind: str) -> Rule:
    """The rule of schedule ``kind``; ValueError for a name without one."""
    rule = RULES_BY_NAME.get(kind)
    if rule is None:
        raise ValueError(f"schedule={kind!r} is not one of {tuple(RULES_BY_NAME)}")
    return rule


def split_components(graph: Graph, kind: str, costs: Optional[Costs] = None) -> Set[Node]:
    """The components whose backward runs as B and W under ``kind``.

    Those that receive from another component (their B has inputs to compute
    a gradient for) and have parameters (costs without a W part have none).
    """
    if not rule_of(kind).splits:
        return set()
    return {n for n in graph.nodes() if graph.ins[n]
            and (costs is None or (len(costs[n]) > 2 and costs[n][2] > 0))}

