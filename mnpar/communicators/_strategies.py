"""Gradient averaging strategies as a table: one row per strategy, checked at import.

A named communicator is the one ``Communicator`` with one row of this
table: the row's reducer averages the gradients (``_reducers``,
``_hierarchical``, ``_pure_nccl``), its cost says what that takes on a
network of links (``mnpar.pipeline.CostModel`` asks it), and its options
say what else the strategy takes. No other module compares a strategy's
name (tests/test_communicators_strategies.py); a name without a row fails at
``strategy_of``. With p ranks, h hosts of q ranks, gradient arrays of
``n_i`` bytes and ``N`` their sum, ``ring`` a ring allreduce (``CostModel.ring``):

==============  ======================  ===============================  ===============
strategy        reducer                 cost (seconds)                   options
==============  ======================  ===============================  ===============
naive           ``NaiveReducer``        sum over i of ring(p, n_i)
flat            ``FlatReducer``         ring(p, N)
hierarchical    ``HierarchicalReducer`` ring(q, N) inside a host, then
                                        ring(h, N) among the hosts'
                                        leaders
pure_nccl       ``PureNcclReducer``     not modelled                     ``wire_dtype``,
                                                                         ``nccl``
==============  ======================  ===============================  ===============

``wire_dtype``: the strategy takes ``allreduce_grad_dtype`` (the dtype
gradients travel in); ``nccl``: it holds an NCCL group of every rank, which
``nccl_sum`` (batch normalization's sums) uses. Adding a strategy is a
reducer class and a row.
"""
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, Type

from ._hierarchical import HierarchicalReducer
from ._pure_nccl import PureNcclReducer
from ._reducers import FlatReducer, NaiveReducer


class Network(Protocol):
    """What a strategy's cost asks of a model of the links (``pipeline.CostModel``)."""

    @property
    def hosts(self) -> Mapping[int, int]:
        """rank -> host."""

    def ring(self, ranks: Sequence[int], nbytes: float) -> float:
        """A ring allreduce of ``nbytes`` over ``ranks``, at the pace of its slowest link."""

    def host_ring(self, ranks: Sequence[int], nbytes: float, between_hosts: bool) -> float:
        """The same on the link between hosts, or on the link inside one."""


Cost = Callable[[Network, Sequence[int], Sequence[int]], float]


def naive_cost(net: Network, ranks: Sequence[int], sizes: Sequence[int]) -> float:
    """One ring per gradient array: a latency each."""
    return sum(net.ring(ranks, n) for n in sizes)


def flat_cost(net: Network, ranks: Sequence[int], sizes: Sequence[int]) -> float:
    """One ring over every array packed in one buffer."""
    return net.ring(ranks, sum(sizes))


def hierarchical_cost(net: Network, ranks: Sequence[int], sizes: Sequence[int]) -> float:
    """A ring inside each host (its reduce and broadcast halves), then one among the
    hosts' leaders; hosts are assumed to hold equally many of ``ranks``."""
    by_host: Dict[int, List[int]] = {}
    for r in ranks:
        by_host.setdefault(net.hosts[r], []).append(r)
    inside = max(by_host.values(), key=len)
    leaders = [members[0] for members in by_host.values()]
    total = sum(sizes)
    return net.host_ring(inside, total, False) + net.host_ring(leaders, total, True)


@dataclass(frozen=True)
class Strategy:
    """How one named communicator averages gradients.

    Attributes:
        name: the name ``create_communicator`` takes.
        reducer: the class that averages (``start_mean``, ``finish``).
        cost: seconds to average arrays of ``sizes`` bytes over ``ranks`` on a
            ``Network``, or None where the strategy is not modelled.
        wire_dtype: whether it takes ``allreduce_grad_dtype``.
        nccl: whether it holds an NCCL group over every rank (``nccl_sum``).
    """

    name: str
    reducer: Type[FlatReducer]
    cost: Optional[Cost] = None
    wire_dtype: bool = False
    nccl: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not (isinstance(self.reducer, type) and issubclass(self.reducer, FlatReducer)):
            problems.append(f"reducer={self.reducer!r} is not a FlatReducer class")
        if self.cost is not None and not callable(self.cost):
            problems.append(f"cost={self.cost!r} is not callable")
        for option, method in (("wire_dtype", "set_wire_dtype"), ("nccl", "nccl_group")):
            own = getattr(self.reducer, method, None) is not getattr(FlatReducer, method)
            if getattr(self, option) != own:
                problems.append(f"{option}={getattr(self, option)} but its reducer "
                                f"{'overrides' if own else 'does not override'} {method}")
        if problems:
            raise ValueError(f"strategy {self.name!r}: " + "; ".join(problems))


STRATEGIES: Tuple[Strategy, ...] = (
    Strategy("naive", NaiveReducer, naive_cost),
    Strategy("flat", FlatReducer, flat_cost),
    Strategy("hierarchical", HierarchicalReducer, hierarchical_cost),
    Strategy("pure_nccl", PureNcclReducer, wire_dtype=True, nccl=True),
)


def _index(rows: Tuple[Strategy, ...]) -> Dict[str, Strategy]:
    """name -> row; a name twice in the table is an error at import."""
    by_name: Dict[str, Strategy] = {}
    for row in rows:
        if row.name in by_name:
            raise ValueError(f"strategy {row.name!r} is in the table twice")
        by_name[row.name] = row
    return by_name


BY_NAME = _index(STRATEGIES)
NAMES = tuple(row.name for row in STRATEGIES)
MODELLED = tuple(row.name for row in STRATEGIES if row.cost is not None)  # CostModel's


def strategy_of(name: str) -> Strategy:
    """The row of strategy ``name``; ValueError for a name without one."""
    row = BY_NAME.get(name)
    if row is None:
        raise ValueError(f"unknown communicator_name {name!r}; valid names: {list(NAMES)}")
    return row


def cost_of(name: str) -> Cost:
    """The cost function of strategy ``name``; ValueError unless it is modelled."""
    row = BY_NAME.get(name)
    if row is None or row.cost is None:
        raise ValueError(f"strategy={name!r} is not one of {MODELLED}")
    return row.cost


__all__ = ["STRATEGIES", "NAMES", "MODELLED", "Strategy", "Network", "strategy_of", "cost_of",
           "FlatReducer", "HierarchicalReducer", "NaiveReducer", "PureNcclReducer"]
