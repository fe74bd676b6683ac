"""A node's shared gradient buffer: the intra-node half of ``hierarchical``.

The ranks of one node share one MPI shared-memory window with one row per
rank, each as long as the packed gradients. Rank ``r`` owns block ``r`` of
the columns::

    step         rank r reads                  rank r writes
    pack         its gradients outside         row r outside block r
                 block r                       (grad / size)
    sync
    reduce       its gradients in block r,     block r of every row (the sum)
                 block r of every other row
    sync         -                             -

After the second barrier every row holds the node's sum, and each rank's
gradients become views of its own row: no copy out, and the ``1/size``
scaling rides along with the copy in. A rank never copies the part of its
gradients that it sums itself, and sums in cache-sized chunks. No rank
writes into another's row outside ``reduce``, which the first barrier of the
next call guards.
Between nodes, the node leaders allreduce their row and the others copy it
(``take_leader_row``), a phase of its own: the reducer may post the leaders'
allreduce and return, and copy later. Double buffering therefore takes turns
between two such buffers, one still being reduced while the other packs.
"""
from typing import Any, Dict, List, Optional, Set, Tuple, cast

import numpy as np
from mpi4py import MPI

from ._wait import wait

_BLOCK_ALIGN = 16  # elements: blocks start on cache-line boundaries
_CHUNK = 64 * 1024  # elements summed and copied out while in cache (docs/benchmarks_history.rst)


class NodeBuffer:
    """A ``(intra.size, total)`` array of ``dtype`` shared by a node's ranks.

    Allocating and freeing are collective over ``intra``.
    """

    def __init__(self, intra: MPI.Comm, dtype: np.dtype, total: int,
                 timeout: Optional[float], describe: Any) -> None:
        self.intra, self.dtype, self.total = intra, np.dtype(dtype), total
        self.timeout, self.describe = timeout, describe
        rows = intra.size
        nbytes = rows * total * self.dtype.itemsize if intra.rank == 0 else 0
        self.win = MPI.Win.Allocate_shared(nbytes, self.dtype.itemsize,
                                           comm=cast(MPI.Intracomm, intra))
        memory, _ = self.win.Shared_query(0)
        self.rows = np.frombuffer(cast(Any, memory), self.dtype, rows * total).reshape(rows, total)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        step = -(-total // intra.size)
        step = -(-step // _BLOCK_ALIGN) * _BLOCK_ALIGN
        start = min(total, intra.rank * step)
        self.block = slice(start, min(total, start + step))

    @property
    def mine(self) -> np.ndarray:
        """This rank's row: its scaled gradients, then the node's sum."""
        return self.rows[self.intra.rank]

    @property
    def leader_row(self) -> np.ndarray:
        return self.rows[0]

    def sync(self) -> None:
        """Makes every rank's writes visible to every other rank (a barrier)."""
        self.win.Sync()
        wait([self.intra.Ibarrier()], self.timeout, self.describe)
        self.win.Sync()

    def take_leader_row(self) -> None:
        """Copies the leader's row (the sum over every node, once the leaders'
        allreduce is done) into every other rank's row. Collective over the node."""
        self.sync()
        if self.intra.rank != 0:
            self.mine[...] = self.leader_row
        self.sync()  # the leader's row is rewritten by its next reduction

    def reduce_block(self, own: List[Tuple[int, Any]], scale: float) -> None:
        """Sums this rank's block of columns over the ranks, into every row.

        This rank's share of the block is read from ``own``, its flat
        gradients with their offsets in a row (in order; only those that
        overlap the block are needed), times ``scale``; the other ranks' come
        from their rows. The work goes in chunks that stay in cache between
        the sum and the copy to the other rows.
        """
        b, me, rows = self.block, self.intra.rank, self.rows
        others = [r for r in range(self.intra.size) if r != me]
        if b.start >= b.stop:
            return
        pieces = iter(own)
        off, g = next(pieces)
        for start in range(b.start, b.stop, _CHUNK):
            stop = min(b.stop, start + _CHUNK)
            out = rows[me, start:stop]
            pos = start
            while pos < stop:
                while off + g.size <= pos:
                    off, g = next(pieces)
                end = min(stop, off + g.size)
                np.multiply(g[pos - off:end - off], scale, out=rows[me, pos:end],
                            casting="unsafe")
                pos = end
            for r in others:
                np.add(out, rows[r, start:stop], out=out)
            for r in others:
                rows[r, start:stop] = out

    def owns(self, array: Any) -> bool:
        """Whether ``array`` views this window's memory."""
        return isinstance(array, np.ndarray) and np.shares_memory(array, self.rows)

    def free(self) -> None:
        """Frees the window; no array may view it any more. Collective."""
        self.rows = np.empty((0, 0), self.dtype)
        self.win.Unlock_all()
        self.win.Free()


class NodePool:
    """A reducer's node buffers, and the parameters whose gradients may view each.

    Every rank of the node asks for buffers in the same order, so all agree on
    which one ``take`` returns, and make and free buffers together.
    """

    def __init__(self, intra: MPI.Comm, timeout: Optional[float], describe: Any) -> None:
        self.intra, self.timeout, self.describe = intra, timeout, describe
        self.nodes: List[NodeBuffer] = []
        self._viewing: Dict[int, List[Any]] = {}  # id of a buffer -> parameters

    def take(self, dtype: np.dtype, params: List[Any], busy: Set[int]) -> NodeBuffer:
        """A buffer for the gradients of ``params`` whose id is not in ``busy`` (the
        buffers of reductions in flight); collective over the node.

        One is made where none of their size is free, after freeing the free
        ones of another size. Gradients of other parameters that still view the
        buffer get their own copy first.
        """
        total = sum(p.grad.size for p in params)
        free = [n for n in self.nodes if n.dtype == dtype and id(n) not in busy]
        node = next((n for n in free if n.total == total), None)
        if node is None:
            for n in free:
                self._release(n)
            node = NodeBuffer(self.intra, dtype, total, self.timeout, self.describe)
            self.nodes.append(node)
        previous = self._viewing.get(id(node), [])
        if [(id(p), p.shape) for p in previous] != [(id(p), p.shape) for p in params]:
            _detach(node, previous)  # a new layout must not write over live views
        self._viewing[id(node)] = params
        return node

    def free(self) -> None:
        """Frees every buffer (collective), after giving gradients that view one their own copy."""
        for node in list(self.nodes):
            self._release(node)

    def _release(self, node: NodeBuffer) -> None:
        self.nodes.remove(node)
        _detach(node, self._viewing.pop(id(node), []))
        node.free()


def _detach(node: NodeBuffer, params: List[Any]) -> None:
    """Gives each of ``params`` whose gradient views ``node`` a copy of its own."""
    for p in params:
        if node.owns(p.grad):
            p.grad = p.grad.copy()
