"""Rows of a tiled axis, fetched by their global index from whichever rank holds them.

Slicing, flipping, padding and resizing along a split axis change which
global rows each rank's output needs, and the rows may sit on any rank of
its line of the grid (padding by more than a tile, a flip, a wrap from the
far end). ``TakeRows`` moves them in one ``Alltoallv`` over the grid: every
rank computes every rank's list of needed rows (a pure function of global
sizes), so each knows what to send and what comes back::

    output row k of rank r  <-  global input row sources(r)[k]     (-1: ``fill``)

The backward sends each output row's gradient back to the row's owner,
which adds it in (a row needed twice gets both gradients). Rows marked
``no_grad`` (chainer's padding drops the gradient of copied border rows)
send nothing back.
"""
from typing import Any, Callable, List, Optional, Sequence, Tuple

import chainer
import numpy as np

from ..._arrays import device_of, get_array_module, to_host
from ._geometry import split
from ._grid import AnyGrid
from ._halo import no_second_order

Sources = Callable[[int], np.ndarray]  # coordinate along the axis -> global rows (or -1)


class TakeRows(chainer.FunctionNode):
    """Along split axis ``axis`` (grid axis ``grid_axis``) of ``n`` global rows, this
    rank's output rows ``sources(coord)``.

    Args:
        grid: the SpatialGrid.
        position: the array axis that the grid's axis ``grid_axis`` splits.
        n: the axis's global extent.
        sources: for a coordinate along the grid axis, the global row each
            output row copies (-1: ``fill``).
        fill: the value of rows with source -1.
        no_grad: for a coordinate, a bool per output row: its gradient is dropped.
        what: the operation's name in errors.
    """

    def __init__(self, grid: AnyGrid, position: int, grid_axis: int, n: int, sources: Sources,
                 fill: float = 0.0, no_grad: Optional[Sources] = None,
                 what: str = "spatial rows") -> None:
        self.grid = grid
        self.position = position
        self.grid_axis = grid_axis
        self.n = n
        self.sources = sources
        self.fill = fill
        self.no_grad = no_grad
        self.what = what

    def _line(self) -> List[int]:
        """Grid ranks along the axis through this rank, by coordinate."""
        coords = list(self.grid.coords)
        line = []
        for c in range(self.grid.shape[self.grid_axis]):
            coords[self.grid_axis] = c
            line.append(int(np.ravel_multi_index(coords, self.grid.shape)))
        return line

    def _plan(self) -> Tuple[List[np.ndarray], List[np.ndarray], np.ndarray]:
        """Rows this rank sends each peer (own indices), where each peer's rows land here,
        and this rank's sources."""
        parts = self.grid.shape[self.grid_axis]
        me = self.grid.coords[self.grid_axis]
        lo, hi = split(self.n, parts, me)
        sizes = [split(self.n, parts, c)[1] - split(self.n, parts, c)[0] for c in range(parts)]
        owner = np.repeat(np.arange(parts), sizes)
        mine = np.asarray(self.sources(me), np.int64)
        send = []
        for c in range(parts):
            theirs = np.asarray(self.sources(c), np.int64)
            rows = theirs[(theirs >= lo) & (theirs < hi)]
            send.append(rows - lo)
        land = [np.nonzero((mine >= 0) & (owner[np.clip(mine, 0, self.n - 1)] == c))[0]
                for c in range(parts)]
        return send, land, mine

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, = inputs
        xp = get_array_module(x)
        self.in_shape = x.shape
        send, land, mine = self._plan()
        moved = np.moveaxis(to_host(x), self.position, 0)
        rest = moved.shape[1:]
        out = np.empty((len(mine),) + rest, x.dtype)
        out[mine < 0] = self.fill
        got = self._exchange([moved[rows] for rows in send], [len(k) for k in land], rest,
                             x.dtype, "forward")
        for k, rows in zip(land, got):
            out[k] = rows
        self.plan = (send, land, mine)
        with device_of(x):
            y = np.ascontiguousarray(np.moveaxis(out, 0, self.position))
            return (y if xp is np else xp.asarray(y)),

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        no_second_order(self.what)
        gy = grad_outputs[0].array
        xp = get_array_module(gy)
        send, land, mine = self.plan
        g = np.moveaxis(to_host(gy), self.position, 0)
        if self.no_grad is not None:
            g = g.copy()
            g[np.asarray(self.no_grad(self.grid.coords[self.grid_axis]), bool)] = 0
        rest = g.shape[1:]
        back = self._exchange([g[k] for k in land], [len(rows) for rows in send], rest,
                              gy.dtype, "backward")
        moved_shape = (self.in_shape[self.position],) + rest
        gx = np.zeros(moved_shape, gy.dtype)
        for rows, part in zip(send, back):
            np.add.at(gx, rows, part)
        with device_of(gy):
            out = np.ascontiguousarray(np.moveaxis(gx, 0, self.position))
            return chainer.Variable(out if xp is np else xp.asarray(out)),

    def _exchange(self, parts: Sequence[np.ndarray], counts: Sequence[int], rest: Tuple[int, ...],
                  dtype: Any, direction: str) -> List[np.ndarray]:
        """``parts[c]`` to the rank at coordinate c of the line; ``counts[c]`` rows back."""
        width = int(np.prod(rest))
        line = self._line()
        if self.grid.size == 1 or len(line) == 1:
            return [np.ascontiguousarray(p).reshape((-1,) + rest) for p in parts]
        size = self.grid.size
        send_counts = np.zeros(size, np.int64)
        recv_counts = np.zeros(size, np.int64)
        for c, rank in enumerate(line):
            send_counts[rank] = len(parts[c]) * width
            recv_counts[rank] = counts[c] * width
        sendbuf = np.concatenate([np.ascontiguousarray(p).reshape(-1) for p in parts]
                                 + [np.empty(0, dtype)]).astype(dtype, copy=False)
        recvbuf = np.empty(int(recv_counts.sum()), dtype)
        sdispl = np.concatenate([[0], np.cumsum(send_counts)[:-1]])
        rdispl = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
        req = self.grid.mpi.Ialltoallv([sendbuf, (send_counts, sdispl)],
                                       [recvbuf, (recv_counts, rdispl)])
        self.grid.wait([req], f"{self.what}: moving rows ({direction})",
                       f"the ranks {line} along the split axis", recvbuf.nbytes)
        out = []
        for rank in line:
            start = int(rdispl[rank])
            out.append(recvbuf[start:start + int(recv_counts[rank])].reshape((-1,) + rest))
        return out


def take_rows(x: Any, grid: AnyGrid, position: int, grid_axis: int, n: int, sources: Sources,
              fill: float = 0.0, no_grad: Optional[Sources] = None,
              what: str = "spatial rows") -> chainer.Variable:
    """``TakeRows`` applied to ``x`` (see the class)."""
    return TakeRows(grid, position, grid_axis, n, sources, fill, no_grad, what).apply((x,))[0]


def output_rows(m: int, parts: int, coord: int) -> np.ndarray:
    """Global output rows of the rank at ``coord`` when ``m`` rows are split ``parts`` ways."""
    return np.arange(*split(m, parts, coord))
