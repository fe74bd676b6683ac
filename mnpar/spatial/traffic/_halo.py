"""Halo exchange: the rows a tile needs from its neighbours, and their gradients back.

``Exchange`` moves arrays (no autograd), one spatial axis after another, so
corners arrive through the neighbour that already has them::

    axis 0 (rows)                axis 1 (columns), full rows extent
    +----+----+                  +----+----+
    | A  | B  |  A sends its     | A  |b   |  A's column halo then spans
    |~~~~|~~~~|  last rows down; |~~~~|~~~~|  the rows it just received:
    | C  | D  |  C sends up      | C  |d   |  D's corner reaches A through B
    +----+----+                  +----+----+

A slab along axis ``d`` spans the whole extended tile on the axes before
``d`` (their halos have arrived), the halo or border rows on ``d``, and the
own rows on the axes after it. The reverse exchange (gradients) walks the
axes backwards with the same slabs: each rank sends its halo's gradient to
the owner, which adds it into its border rows.

Both directions post non-blocking sends and receives per axis; ``progress``
tests them and posts the next axis, so a layer can compute between tests
while MPI moves the halo (on CPUs MPI moves a large message only inside MPI
calls). GPU arrays travel through host buffers.
"""
from typing import Any, List, Sequence, Tuple

import chainer
import numpy as np
from mpi4py import MPI

from ..._arrays import device_of, get_array_module, to_host
from ._geometry import DimPlan, halo_plan, unit_of
from ._grid import SpatialGrid, require_grid

FORWARD_TAG = 1
REVERSE_TAG = 64

Index = Tuple[slice, ...]


def no_second_order(what: str) -> None:
    """Raises where a backward pass is asked to be differentiable (double backprop)."""
    if chainer.config.enable_backprop:
        raise NotImplementedError(f"{what} has no second-order gradients (the backward pass "
                                  "of a spatial layer is not itself differentiable)")


class Layout:
    """Where a tile's own rows, halos and padding sit in its extended tile."""

    def __init__(self, plans: Sequence[DimPlan]) -> None:
        self.plans = tuple(plans)
        self.shape = tuple(p.ext for p in plans)
        self.own = tuple(slice(p.pad_lo + p.lo, p.pad_lo + p.lo + p.own[1] - p.own[0])
                         for p in plans)
        self.trimmed = tuple(slice(p.trim_lo, p.ext - p.trim_hi) for p in plans)

    def slab(self, axis: int, rows: slice) -> Index:
        """Axes before ``axis`` whole, ``rows`` on it, own rows after it (with N and C)."""
        spatial = tuple(slice(None) if e < axis else rows if e == axis else self.own[e]
                        for e in range(len(self.plans)))
        return (slice(None), slice(None)) + spatial

    def build(self, x: Any, fill: float) -> Any:
        """The extended tile of ``x``: own rows in place, padding filled, halos still empty."""
        xp = get_array_module(x)
        with device_of(x):
            ext = xp.empty(x.shape[:2] + self.shape, dtype=x.dtype)
            for axis, p in enumerate(self.plans):
                for rows in (slice(0, p.pad_lo), slice(p.ext - p.pad_hi, p.ext)):
                    if rows.stop > rows.start:
                        ext[(slice(None), slice(None)) + (slice(None),) * axis + (rows,)] = fill
            ext[(slice(None), slice(None)) + self.own] = x
        return ext


class Exchange:
    """One halo exchange of an extended tile, forward (halos in) or reverse (gradients out)."""

    def __init__(self, grid: SpatialGrid, layout: Layout, ext: Any, reverse: bool,
                 what: str) -> None:
        self.grid = grid
        self.layout = layout
        self.ext = ext
        self.reverse = reverse
        self.what = what
        axes = [a for a in range(grid.ndim) if grid.shape[a] > 1]
        self.axes = axes[::-1] if reverse else axes
        self.step = 0
        self.reqs: List[MPI.Request] = []
        self.landing: List[Tuple[Index, np.ndarray]] = []
        self.sent: List[np.ndarray] = []
        self.nbytes = 0
        self._post()

    @property
    def done(self) -> bool:
        return self.step >= len(self.axes)

    def progress(self) -> bool:
        """Tests the axis in flight; when it has landed, posts the next. True once all is done."""
        while not self.done and MPI.Request.Testall(self.reqs):
            self._land()
        return self.done

    def finish(self) -> Any:
        """Waits for every axis; returns the extended tile (halos filled, or gradients added)."""
        while not self.done:
            axis = self.axes[self.step]
            self.grid.wait(self.reqs, f"{self.what}: halo {'gradient ' if self.reverse else ''}"
                           f"exchange along spatial axis {axis}",
                           f"the neighbours {self._neighbours(axis)}", self.nbytes)
            self._land()
        return self.ext

    def _neighbours(self, axis: int) -> List[int]:
        return [r for r in (self.grid.neighbour(axis, -1), self.grid.neighbour(axis, 1))
                if r is not None]

    def _land(self) -> None:
        xp = get_array_module(self.ext)
        with device_of(self.ext):
            for index, buf in self.landing:
                data = buf if xp is np else xp.asarray(buf)
                if self.reverse:
                    self.ext[index] += data
                else:
                    self.ext[index] = data
        self.step += 1
        self._post()

    def _post(self) -> None:
        """Posts the sends and receives of the next axis with traffic."""
        self.reqs, self.landing, self.sent, self.nbytes = [], [], [], 0
        while not self.done:
            self._post_axis(self.axes[self.step])
            if self.reqs:
                return
            self.step += 1

    def _post_axis(self, axis: int) -> None:
        p, lay, comm = self.layout.plans[axis], self.layout, self.grid.mpi
        own = lay.own[axis]
        halo_lo = slice(p.pad_lo, p.pad_lo + p.lo)
        halo_hi = slice(own.stop, own.stop + p.hi)
        border_lo = slice(own.start, own.start + p.send_lo)
        border_hi = slice(own.stop - p.send_hi, own.stop)
        down, up = self.grid.neighbour(axis, -1), self.grid.neighbour(axis, 1)
        base = (REVERSE_TAG if self.reverse else FORWARD_TAG) + 2 * axis
        if self.reverse:  # halo gradients go to their owners, border gradients come back
            sends = [(halo_lo, down, base), (halo_hi, up, base + 1)]
            recvs = [(border_lo, down, base + 1), (border_hi, up, base)]
        else:
            sends = [(border_lo, down, base), (border_hi, up, base + 1)]
            recvs = [(halo_lo, down, base + 1), (halo_hi, up, base)]
        for rows, peer, tag in recvs:
            if peer is None or rows.stop <= rows.start:
                continue
            index = lay.slab(axis, rows)
            shape = self.ext[index].shape
            buf = np.empty(shape, dtype=self.ext.dtype)
            self.reqs.append(comm.Irecv(buf, peer, tag))
            self.landing.append((index, buf))
            self.nbytes += buf.nbytes
        for rows, peer, tag in sends:
            if peer is None or rows.stop <= rows.start:
                continue
            with device_of(self.ext):
                data = np.ascontiguousarray(to_host(self.ext[lay.slab(axis, rows)]))
            self.reqs.append(comm.Isend(data, peer, tag))
            self.sent.append(data)  # alive until the send completes
            self.nbytes += data.nbytes


def _plans_for_halo(grid: SpatialGrid, shape: Tuple[int, ...], halo: Any) -> List[DimPlan]:
    spatial = shape[2:]
    widths = _halo_widths(halo, grid.ndim)
    plans = []
    for axis, n in enumerate(spatial):
        parts = grid.shape[axis] if axis < grid.ndim else 1
        coord = grid.coords[axis] if axis < grid.ndim else 0
        lo, hi = widths[axis] if axis < grid.ndim else (0, 0)
        plans.append(halo_plan(n, parts, coord, lo, hi, unit_of(axis, len(spatial))))
    return plans


WIDTHS = "each entry must be a non-negative int or a (lo, hi) pair of them"


def _halo_widths(halo: Any, ndim: int) -> List[Tuple[int, int]]:
    """``halo`` (an int, one per axis, or ``(lo, hi)`` per axis) as ``(lo, hi)`` per axis."""
    def width(v: Any) -> int:
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
            raise ValueError(f"halo {halo!r}: {WIDTHS}, not {v!r}")
        return int(v)

    if not isinstance(halo, (tuple, list)):
        return [(width(halo), width(halo))] * ndim
    if len(halo) != ndim:
        raise ValueError(f"halo {halo!r} must have one entry per split axis ({ndim})")
    out = []
    for item in halo:
        if isinstance(item, (tuple, list)):
            if len(item) != 2:
                raise ValueError(f"halo {halo!r}: {WIDTHS}, not {item!r}")
            out.append((width(item[0]), width(item[1])))
        else:
            out.append((width(item), width(item)))
    return out


class HaloExchange(chainer.FunctionNode):
    """``halo_exchange``'s node: forward fills the halo, backward returns its gradient."""

    def __init__(self, grid: SpatialGrid, halo: Any, fill: float) -> None:
        self.grid = grid
        self.halo = halo
        self.fill = fill

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, = inputs
        shape = self.grid.global_shape(x.shape, "halo_exchange")
        self.layout = Layout(_plans_for_halo(self.grid, shape, self.halo))
        ext = self.layout.build(x, self.fill)
        return Exchange(self.grid, self.layout, ext, False, "halo_exchange").finish(),

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        no_second_order("halo_exchange")
        gy, = grad_outputs
        g = gy.array.copy()
        Exchange(self.grid, self.layout, g, True, "halo_exchange").finish()
        return chainer.Variable(g[(slice(None), slice(None)) + self.layout.own]),


def halo_exchange(x: Any, grid: SpatialGrid, halo: Any, fill: float = 0.0) -> chainer.Variable:
    """This rank's tile extended by ``halo`` rows of its neighbours' tiles on each side.

    Differentiable: the backward adds each halo row's gradient into the rank
    that owns the row. At the image's edges the halo is ``fill``.

    Args:
        x: this rank's tile ``(N, C, *spatial)`` (array or Variable).
        grid (SpatialGrid): the grid that tiled the image.
        halo: rows on each side of every axis the grid covers: an int, one int
            per axis, or a ``(lo, hi)`` pair per axis. An axis of the grid with one
            rank gets ``fill`` rows on both sides; spatial axes beyond the grid's
            get none.
        fill: the value of halo rows beyond the image's edges.

    Raises:
        ValueError: a halo wider than a neighbour's tile, or tiles that are not
            the balanced tiles of one image (on every rank alike).
    """
    require_grid(grid, "halo_exchange")
    return HaloExchange(grid, halo, fill).apply((x,))[0]
