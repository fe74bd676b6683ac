"""The component graph: every rank's MultiNodeChainList wiring, joined.

A MultiNodeChainList on one rank knows only its own ``(rank_in, rank_out)``
pairs. Its messages are matched first in first out per pair of ranks, so the
k-th send from rank ``s`` to rank ``d`` meets the k-th receive on ``d`` from
``s`` (a rank's sends to itself go through a local queue the same way). Joined
over all ranks, that gives a directed graph whose nodes are components
``(rank, index)`` and whose edges carry one component's output into one
positional argument of another. The seed MLP's loop is acyclic here::

    rank 0: A (None -> 1), B (1 -> None)      (0,0) A --e0--> (1,0) C
    rank 1: C (0 -> 0)                        (1,0) C --e1--> (0,1) B -> loss

Schedules are generated from this graph; it is pure Python, no MPI.
"""
from collections import defaultdict
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from .._errors import WiringError

Ranks = Optional[Tuple[int, ...]]
Wiring = Tuple[Ranks, Ranks]  # (rank_in, rank_out) of one component, as add_link keeps it
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
        wirings: rank -> that rank's ``(rank_in, rank_out)`` per component, in
            the order the components were added.

    Raises:
        WiringError: sends and receives between two ranks do not pair up, a
            rank receives from itself before it sends, or the components form a
            cycle.
    """

    def __init__(self, wirings: Mapping[int, Sequence[Wiring]]) -> None:
        self.wirings = {r: [(_tuple(i), _tuple(o)) for i, o in w] for r, w in wirings.items()}
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
        return self.wirings[node[0]][node[1]][1] is None

    def takes_inputs(self, node: Node) -> bool:
        """Whether ``node`` takes the model's inputs (``rank_in=None``)."""
        return self.wirings[node[0]][node[1]][0] is None

    def stages(self) -> int:
        """The number of ranks that hold at least one component."""
        return sum(1 for r in self.ranks if self.wirings[r]) or 1

    def _match(self) -> None:
        sends: Dict[Tuple[int, int], List[Node]] = defaultdict(list)
        recvs: Dict[Tuple[int, int], List[Tuple[Node, int]]] = defaultdict(list)
        for rank in self.ranks:
            for c, (rank_in, rank_out) in enumerate(self.wirings[rank]):
                for pos, src in enumerate(rank_in or ()):
                    recvs[(src, rank)].append(((rank, c), pos))
                for dst in rank_out or ():
                    sends[(rank, dst)].append((rank, c))
        pairs = sorted(set(sends) | set(recvs))
        found = []
        for src, dst in pairs:
            out, into = sends.get((src, dst), []), recvs.get((src, dst), [])
            if src in self.wirings and dst in self.wirings and len(out) != len(into):
                found.append((src, dst, out, into))
                continue
            for producer, (consumer, pos) in zip(out, into):
                if src == dst and consumer[1] <= producer[1]:
                    raise WiringError(
                        f"rank {src} component {consumer[1]} receives from its own rank "
                        f"before component {producer[1]} sends to it")
                edge = Edge(len(self.edges), producer, consumer, pos)
                self.edges.append(edge)
                self.outs[producer].append(edge)
                self.ins[consumer].append(edge)
        if found:
            src, dst, out, into = found[0]
            raise WiringError(
                f"rank {src} sends {len(out)} time(s) to rank {dst} (components "
                f"{[n[1] for n in out]}), but rank {dst} receives {len(into)} time(s) from "
                f"rank {src} (components {[n[1] for n, _ in into]}); every send needs one "
                "receive")
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


def _tuple(ranks: Optional[Sequence[int]]) -> Ranks:
    return None if ranks is None else tuple(int(r) for r in ranks)
