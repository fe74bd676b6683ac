"""Reductions over the split axes: one allreduce, and every rank holds the whole result.

A sum, mean, max or min over axes that include *every* split axis is this
rank's partial result combined over the grid (one allreduce, sums in
float64 on the wire); the result is the whole image's, the same on every
rank (marked ``Whole``). Its backward needs no communication: the output's
gradient is the same on every rank (the guard sums it where the result meets
a tile), so each rank hands its tile ``gy`` broadcast (sum, mean) or
``gy`` where the tile holds the maximum (max, min; ties all get it, as in
chainer). A reduction over some of the split axes only would leave a value
tiled along the others and repeated along the reduced ones: the guard
refuses it (``guard/_convertible``, which hands the others to ``GridReduce``).
A pooling whose one window covers the image is such a reduction too
(``global_pool``).
"""
from typing import Any, Optional, Sequence, Tuple

import chainer
import chainer.functions as F
import numpy as np
from mpi4py import MPI

from ..._arrays import device_of, get_array_module, to_host
from .._marks import Whole, mark
from ._geometry import Window
from ._grid import AnyGrid, SpatialGrid

OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


def allreduce(grid: AnyGrid, buf: Any, op: str, what: str) -> Any:
    """``buf`` reduced over the grid's ranks with ``op`` (collective; a new array)."""
    if grid.size == 1:
        return buf.copy()
    xp = get_array_module(buf)
    host = np.ascontiguousarray(to_host(buf))
    out = np.empty_like(host)
    grid.wait([grid.mpi.Iallreduce(host, out, op=OPS[op])], f"{what}: reducing over the grid",
              nbytes=host.nbytes)
    if xp is np:
        return out
    with device_of(buf):
        return xp.asarray(out)


class GridReduce(chainer.FunctionNode):
    """``op`` (sum, max or min) over ``axes`` of the tile and over the grid, times ``scale``."""

    def __init__(self, grid: AnyGrid, op: str, axes: Tuple[int, ...], keepdims: bool,
                 scale: float = 1.0) -> None:
        self.grid = grid
        self.op = op
        self.axes = axes
        self.keepdims = keepdims
        self.scale = scale

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, = inputs
        self.shape = x.shape
        what = f"spatial {self.op}"
        if self.op == "sum":
            part = x.sum(axis=self.axes, keepdims=True, dtype=np.float64)
            total = allreduce(self.grid, part, "sum", what)
            if self.scale != 1.0:
                total = total * self.scale
            total = total.astype(x.dtype, copy=False)
        else:
            part = x.max(axis=self.axes, keepdims=True) if self.op == "max" \
                else x.min(axis=self.axes, keepdims=True)
            total = allreduce(self.grid, part, self.op, what)
            self.retain_inputs((0,))
            self.kept = total
        xp = get_array_module(x)
        out = total if self.keepdims else total.reshape(self._squeezed())
        return xp.asarray(out),

    def _squeezed(self) -> Tuple[int, ...]:
        return tuple(n for a, n in enumerate(self.shape) if a not in self.axes)

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        gy, = grad_outputs
        kept = tuple(1 if a in self.axes else n for a, n in enumerate(self.shape))
        gy = F.broadcast_to(F.reshape(gy, kept), self.shape)
        if self.op == "sum":
            return (gy * self.scale if self.scale != 1.0 else gy),
        x = self.get_retained_inputs()[0].array
        hit = (x == self.kept)
        return gy * hit.astype(gy.dtype),


def global_window(windows: Sequence[Window], extents: Sequence[int]
                  ) -> Optional[Tuple[Tuple[int, int], ...]]:
    """The box of rows ``[a, b)`` per axis that a pooling window reads, where it has one
    output along every axis (a global pooling, the same on every grid); else None."""
    outs = [w.out_size(n) for w, n in zip(windows, extents)]
    if any(m != 1 for m in outs):
        return None
    return tuple((max(0, -w.pad), min(n, w.extent - w.pad)) for w, n in zip(windows, extents))


def global_pool(x: Any, grid: SpatialGrid, spatial: Sequence[int], box: Sequence[Tuple[int, int]],
                op: str, divisor: int) -> chainer.Variable:
    """Pooling whose one window covers ``box``: a reduction of the box over the grid.

    Max pooling sends the gradient to the first maximum in the window's
    row-major order, wherever it is, as chainer's does.
    """
    slices = grid.tile_slices(spatial)
    index = [slice(None), slice(None)]
    offsets, dims = [], []
    for (a, b), own in zip(box, slices):
        start, stop = max(a, own.start), min(b, own.stop)
        stop = max(stop, start)
        index.append(slice(start - own.start, stop - own.start))
        offsets.append(start - a)
        dims.append(b - a)
    part = x[tuple(index)]
    node = GlobalPool(grid, op, divisor, tuple(offsets), tuple(dims))
    return mark(node.apply((part,))[0], Whole(grid))


class GlobalPool(chainer.FunctionNode):
    """The window's part of this tile, reduced over the grid: ``(N, C, 1, ...)`` everywhere.

    ``offsets``: where the part starts in the window's box, per axis; ``dims``:
    the box's extents.
    """

    def __init__(self, grid: SpatialGrid, op: str, divisor: int, offsets: Tuple[int, ...],
                 dims: Tuple[int, ...]) -> None:
        self.grid = grid
        self.op = op
        self.divisor = divisor
        self.offsets = offsets
        self.dims = dims

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, = inputs
        self.shape = x.shape
        xp = get_array_module(x)
        lead = x.shape[:2] + (1,) * (x.ndim - 2)
        axes = tuple(range(2, x.ndim))
        if self.op == "sum":
            part = x.sum(axis=axes, keepdims=True, dtype=np.float64)
            total = allreduce(self.grid, part, "sum", "spatial average pooling")
            return (total / self.divisor).astype(x.dtype),
        part = x.max(axis=axes, keepdims=True) if x.size else xp.full(lead, -np.inf, x.dtype)
        total = allreduce(self.grid, part, "max", "spatial max pooling")
        big = np.iinfo(np.int64).max
        first = np.full(x.shape[:2], big, np.int64)
        if x.size:
            hit = (x == total).reshape(x.shape[:2] + (-1,))
            pos = hit.argmax(axis=2)
            found = hit.any(axis=2)
            if xp is not np:
                pos, found = pos.get(), found.get()
            coords = np.unravel_index(pos, x.shape[2:])
            box = np.ravel_multi_index(tuple(c + o for c, o in zip(coords, self.offsets)),
                                       self.dims)
            first = np.where(found, box, big)
        self.winner = allreduce(self.grid, first, "min", "spatial max pooling")
        self.mine = first
        return total,

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        gy, = grad_outputs
        if self.op == "sum":
            return F.broadcast_to(gy / self.divisor, self.shape),
        xp = get_array_module(gy.array)
        g = np.zeros(self.shape, gy.dtype)
        values = gy.array.reshape(self.shape[:2])
        if xp is not np:
            values = values.get()
        for n, c in zip(*np.nonzero(self.mine == self.winner)):
            box = np.unravel_index(self.winner[n, c], self.dims)
            g[(n, c) + tuple(int(b - o) for b, o in zip(box, self.offsets))] = values[n, c]
        with device_of(gy.array):
            return chainer.Variable(g if xp is np else xp.asarray(g)),
