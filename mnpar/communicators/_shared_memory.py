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
Between nodes, the node leaders allreduce their row and the others copy it.
"""
from typing import Any, List, Optional, Tuple, cast

import numpy as np
from mpi4py import MPI

from ._wait import wait

_BLOCK_ALIGN = 16  # elements: blocks start on cache-line boundaries
_CHUNK = 64 * 1024  # elements summed and copied out while in cache (measured best)


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
