"""A model of a training step's time: compute, messages and gradient allreduce.

The schedule's clock (``_proof.makespan``) counts ticks and lets messages
travel for free, which holds inside a host and fails across a network. This
model keeps the schedule (a rank runs its list in order, an action starts
once its rank is free and its inputs have arrived) and gives every part a
time in seconds:

* an action: its component's measured forward, B or W time (a B without its
  W costs both, as ``action_cost`` says);
* a message on an edge between two ranks: the alpha-beta (Hockney) model of
  the link it crosses, ``t(n) = alpha + n / beta``, with one link inside a
  host and another between hosts; the sender does not wait for it;
* the gradients of each data-parallel group, averaged once the group's last
  rank has finished its actions (``allreduce``), then each rank's update.

A step ends when the last rank's update ends::

    rank0  F0 F1 ...........B1 B0 | allreduce(dp group of rank 0) | update
    rank1     ~a~F0 F1 B1 B0      | (messages ~a~ delay only their receiver)

The allreduce of ``n`` bytes over ``p`` ranks (ring: a reduce-scatter and an
allgather, each ``p - 1`` steps of ``n / p`` bytes; ``gamma`` the rate at
which a rank sums bytes)::

    ring(p, n, link) = 2 (p - 1) alpha + 2 (p - 1) / p * n / beta + (p - 1) / p * n / gamma

Each averaging strategy's cost is its row of the communicators' strategy
table (``communicators/_strategies.py``: ``naive`` a ring per gradient
array, ``flat`` one over them all, ``hierarchical`` one inside each host and
one among the hosts' leaders), asked with this model as its network
(``ring``, ``host_ring``, ``hosts``); nothing here names a strategy. A ring
over ranks on more than one host runs at the pace of its slowest link, the
link between hosts. Everything here is pure Python, no MPI.
"""
from typing import Dict, Mapping, NamedTuple, Optional, Sequence, Tuple, cast

from ..communicators._facade import MODELLED, cost_of
from ._actions import Action, Costs, Schedule, dependencies
from ._graph import Graph, Node
from ._proof import finish_times

# A component's forward, B and W in seconds (W 0: its backward is one action, all in B).
Times = Dict[Node, Tuple[float, float, float]]
STRATEGIES = MODELLED  # the strategies with a cost: ("naive", "flat", "hierarchical")


class Link(NamedTuple):
    """One kind of link: ``latency`` (alpha, seconds) and ``bandwidth`` (beta, bytes/s)."""

    latency: float
    bandwidth: float

    def time(self, nbytes: float) -> float:
        """``alpha + nbytes / beta``."""
        return self.latency + nbytes / self.bandwidth


class Group(NamedTuple):
    """A data-parallel group: its ``ranks`` average gradient arrays of ``sizes`` bytes."""

    ranks: Sequence[int]
    sizes: Sequence[int]
    strategy: str


def hosts_of(layout: Sequence[int]) -> Dict[int, int]:
    """rank -> host for ``layout[i]`` ranks on host i, in rank order: ``[2, 2]`` ->
    ``{0: 0, 1: 0, 2: 1, 3: 1}``."""
    return {r: h for h, k in enumerate(layout)
            for r in range(sum(layout[:h]), sum(layout[:h]) + k)}


class CostModel:
    """Predicts a step's seconds from links, compute times and the layout.

    Args:
        hosts: rank -> host (``hosts_of(layout)``).
        intra: the link between two ranks of one host.
        inter: the link between hosts.
        sum_rate: bytes per second a rank adds in a reduction (gamma; inf: free).
        collective: the links (inside a host, between hosts) an allreduce's
            ring runs at, where they differ from ``intra`` and ``inter``: an
            allreduce sends and receives at once, and a non-blocking one moves
            only while its rank calls MPI, so its alpha and beta are best
            fitted to a timed allreduce. None: ``(intra, inter)``.

    Example::

        model = CostModel(hosts_of([1, 1]), Link(4e-6, 14e9), Link(20e-6, 2e9))
        ends = model.pipeline(graph, plan(graph, 4, "1f1b"), times, {0: 1 << 20})
        seconds = model.predict_step(ends)
    """

    def __init__(self, hosts: Mapping[int, int], intra: Link, inter: Link,
                 sum_rate: float = float("inf"),
                 collective: Optional[Tuple[Link, Link]] = None) -> None:
        self.hosts = dict(hosts)
        self.intra = intra
        self.inter = inter
        self.sum_rate = sum_rate
        self.collective = (intra, inter) if collective is None else collective

    def link(self, a: int, b: int) -> Link:
        """The link between ranks ``a`` and ``b``."""
        return self.intra if self.hosts[a] == self.hosts[b] else self.inter

    def message(self, src: int, dst: int, nbytes: float) -> float:
        """A message's seconds: nothing to the rank itself, else its link's ``t(n)``."""
        return 0.0 if src == dst else self.link(src, dst).time(nbytes)

    def pipeline(self, graph: Graph, schedule: Schedule, times: Times,
                 message_bytes: Mapping[int, float]) -> Dict[int, float]:
        """rank -> when its last action ends, every rank running its list in order.

        Args:
            graph: the component graph.
            schedule: rank -> its actions (``plan(...)``).
            times: each component's forward, B and W seconds.
            message_bytes: edge id -> bytes of one micro-batch's message on it
                (the gradient going back has the same size).
        """
        def delay(dep: Tuple[int, Action], rank: int, action: Action) -> float:
            return self.message(dep[0], rank, self._bytes(graph, rank, action, dep,
                                                           message_bytes))
        return finish_times(graph, schedule, cast(Costs, times), delay)

    @staticmethod
    def _bytes(graph: Graph, rank: int, action: Action, dep: Tuple[int, Action],
               message_bytes: Mapping[int, float]) -> float:
        """The bytes that come to ``action`` from ``dep``, one of its dependencies:
        an edge's message (or the gradient back along it), none from the rank itself."""
        node = (rank, action.component)
        if action.weight:
            return 0.0
        edges = graph.ins[node] if not action.backward else [None] + graph.outs[node]
        where = dependencies(graph, rank, action).index(dep)
        edge = edges[where]
        return 0.0 if edge is None else message_bytes[edge.id]

    def ring(self, ranks: Sequence[int], nbytes: float, link: Optional[Link] = None) -> float:
        """A ring allreduce of ``nbytes`` over ``ranks`` at the pace of its slowest link:
        ``2 (p - 1) alpha + 2 (p - 1) / p * n / beta + (p - 1) / p * n / gamma``."""
        p = len(ranks)
        if p < 2:
            return 0.0
        if link is None:
            across = len({self.hosts[r] for r in ranks}) > 1
            link = self.collective[1] if across else self.collective[0]
        share = (p - 1) / p * nbytes
        return 2 * (p - 1) * link.latency + 2 * share / link.bandwidth + share / self.sum_rate

    def host_ring(self, ranks: Sequence[int], nbytes: float, between_hosts: bool) -> float:
        """``ring`` on the collective link between hosts, or on the one inside a host."""
        return self.ring(ranks, nbytes, self.collective[1 if between_hosts else 0])

    def allreduce(self, ranks: Sequence[int], sizes: Sequence[int], strategy: str) -> float:
        """Seconds to average gradient arrays of ``sizes`` bytes over ``ranks``: the cost
        of ``strategy``'s row of the strategy table, on this model's links.

        ``naive``: one ring per array; ``flat``: one ring over them all;
        ``hierarchical``: a ring inside each host (its reduce and broadcast
        halves), then one among the hosts' leaders; hosts are assumed to hold
        equally many of ``ranks``.

        Raises:
            ValueError: ``strategy`` is not one of ``STRATEGIES`` (``pure_nccl`` has
                no cost here).
        """
        return cost_of(strategy)(self, ranks, sizes)

    def predict_step(self, ends: Mapping[int, float], groups: Sequence[Group] = (),
                     update: Optional[Mapping[int, float]] = None) -> float:
        """A step's seconds: every rank's compute, its group's allreduce, its update.

        Args:
            ends: rank -> when its compute ends (``pipeline(...)``, or a data-parallel
                rank's forward and backward time).
            groups: the data-parallel groups; each averages once its last rank
                is done, and its ranks go on together.
            update: rank -> seconds of its optimizer's update (default 0).
        """
        done = dict(ends)
        for g in groups:
            together = max(done[r] for r in g.ranks) + self.allreduce(g.ranks, g.sizes,
                                                                       g.strategy)
            done.update({r: together for r in g.ranks})
        update = update or {}
        return max(t + update.get(r, 0.0) for r, t in done.items())
