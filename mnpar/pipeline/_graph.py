"""The component graph: every rank's MultiNodeChainList wiring, joined.

A MultiNodeChainList on one rank knows only its own ``(rank_in, rank_out)``
pairs. Joined over all ranks by the links' matching rule
(``mnpar.links._wiring.messages``: the k-th send from rank ``s`` to rank ``d``
meets the k-th receive on ``d`` from ``s``, a rank's sends to itself
included), they give a directed graph whose nodes are components
``(rank, index)`` and whose edges carry one component's output into one
positional argument of another. The seed MLP's loop is acyclic here::

    rank 0: A (None -> 1), B (1 -> None)      (0,0) A --e0--> (1,0) C
    rank 1: C (0 -> 0)                        (1,0) C --e1--> (0,1) B -> loss

Schedules are generated from this graph; it is pure Python, no MPI.
"""
from typing import Dict, List, Mapping, NamedTuple, Sequence, Tuple

from .._errors import WiringError
from ..links._wiring import Message, Ranks, as_wiring, check_self_sends, operations

Node = Tuple[int, int]  # (rank, component index)


class Edge(NamedTuple):
    """One output of ``src`` carried into argument ``position`` of ``dst``."""

    id: int
    src: Node
    dst: Node
    position: int

    @property
    def local(self) -> bool:
        return self.src[0] == self.dst[0]


class Graph:
    """The components of every rank and the edges between them.

    Args:
        wirings: rank -> that rank's wiring (``MultiNodeChainList.wiring``: a
            ``(rank_in, rank_out)`` per component, in the order they were added).

    Raises:
        WiringError: sends and receives between two ranks do not pair up, a
            rank's sends to itself do not pair up with later receives
            (``check_self_sends``), or the components form a cycle.
    """

    def __init__(self, wirings: Mapping[int, Sequence[Tuple[Ranks, Ranks]]]) -> None:
        self.wirings = {r: as_wiring(w) for r, w in wirings.items()}
        self.ranks = sorted(self.wirings)
        self.edges: List[Edge] = []
        self.ins: Dict[Node, List[Edge]] = {n: [] for n in self.nodes()}
        self.outs: Dict[Node, List[Edge]] = {n: [] for n in self.nodes()}
        self._match()
        self.depth = self._depths()

    def nodes(self) -> List[Node]:
        """Every component, rank by rank in order."""
        return [(r, c) for r in self.ranks for c in range(len(self.wirings[r]))]

    def components(self, rank: int) -> List[int]:
        return list(range(len(self.wirings.get(rank, ()))))

    def is_output(self, node: Node) -> bool:
        """Whether ``node`` gives the model's output (``rank_out=None``)."""
        return self.wirings[node[0]][node[1]].rank_out is None

    def takes_inputs(self, node: Node) -> bool:
        """Whether ``node`` takes the model's inputs (``rank_in=None``)."""
        return self.wirings[node[0]][node[1]].rank_in is None

    def stages(self) -> int:
        """The number of ranks that hold at least one component."""
        return sum(1 for r in self.ranks if self.wirings[r]) or 1

    def _match(self) -> None:
        senders: Dict[Message, Node] = {}
        receivers: Dict[Message, Tuple[Node, int]] = {}  # -> (component, place in rank_in)
        for rank in self.ranks:
            check_self_sends(rank, self.wirings[rank])
            for op, place, message in operations(rank, self.wirings[rank]):
                if op.kind == "send":
                    senders[message] = (rank, op.component)
                else:
                    receivers[message] = ((rank, op.component), place)
        unpaired = sorted(m for m in senders.keys() ^ receivers.keys()
                          if m[0] in self.wirings and m[1] in self.wirings)
        if unpaired:
            src, dst, _ = unpaired[0]
            out = [c for m, (_, c) in senders.items() if m[:2] == (src, dst)]
            into = [c for m, ((_, c), _) in receivers.items() if m[:2] == (src, dst)]
            raise WiringError(
                f"rank {src} sends {len(out)} time(s) to rank {dst} (components {out}), but "
                f"rank {dst} receives {len(into)} time(s) from rank {src} (components "
                f"{into}); every send needs one receive")
        for message in sorted(senders.keys() & receivers.keys()):
            consumer, place = receivers[message]
            edge = Edge(len(self.edges), senders[message], consumer, place)
            self.edges.append(edge)
            self.outs[edge.src].append(edge)
            self.ins[consumer].append(edge)
        for node in self.ins:
            self.ins[node].sort(key=lambda e: e.position)

    def _depths(self) -> Dict[Node, int]:
        """Longest path from a component taking the model's inputs (Kahn's order)."""
        waiting = {n: len(self.ins[n]) for n in self.ins}
        depth = {n: 0 for n in self.ins}
        ready = [n for n, k in waiting.items() if k == 0]
        seen = 0
        while ready:
            node = ready.pop()
            seen += 1
            for e in self.outs[node]:
                depth[e.dst] = max(depth[e.dst], depth[node] + 1)
                waiting[e.dst] -= 1
                if waiting[e.dst] == 0:
                    ready.append(e.dst)
        if seen != len(depth):
            stuck = sorted(n for n, k in waiting.items() if k)
            raise WiringError(f"the components {stuck} (rank, index) wait for each other's "
                              "outputs in a cycle; no order of micro-batches can run them")
        return depth

