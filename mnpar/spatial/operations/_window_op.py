"""One spatial layer: chainer's sliding-window op on a tile, its halo, and overlap.

``WindowOp`` is the node behind every spatial convolution, deconvolution and
pooling. It cuts the rank's outputs into pieces by what they read::

    +---------------------+     interior: reads own rows (and edge padding)
    |        top          |       only, computed while the halo travels;
    +----+-----------+----+     border slabs (top, bottom, then left, right
    |left| interior  |right     within the interior's rows): read the halo,
    +----+-----------+----+       computed once it has landed.
    |       bottom        |
    +---------------------+

Each piece runs chainer's own op on its own small graph, kept for the
backward pass. The interior reads the tile itself (a view, with chainer's
padding along an unsplit axis), so its graph holds nothing the layer before
does not hold already; the border slabs read thin copies out of the extended
tile (halo and edge padding in it, padding 0 for the op), which lives only
through the forward. The backward runs in the order that lets communication
overlap computation:

    forward    post axis-0 halo | interior (testing MPI between chunks) |
               remaining axes | border slabs
    backward   border slabs' input gradient | post the halo gradients |
               interior input gradient, every weight gradient (testing MPI) |
               remaining axes | sum weight gradients over the grid

With ``overlap=False`` there is one piece, the whole output, computed after
the exchange from the extended tile (kept for the backward). A large output
runs one sample at a time (``per_sample``). Weight and bias gradients are
summed over the grid's ranks, so each rank's are those of the whole image.
Second-order gradients are not supported.
"""
import functools
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import chainer
import numpy as np

from ..._arrays import device_of, get_array_module
from ..traffic._geometry import DimPlan, Window, plan_dim, unit_of
from ..traffic._grid import SpatialGrid
from ..traffic._halo import Exchange, Layout, no_second_order

CHUNK_BYTES = 1 << 16  # a halo above this is moved in MPI calls between interior chunks
CHUNKS = 4
SAMPLE_PIXELS = 4096  # an output tile this large runs one sample at a time

Index = Tuple[slice, ...]
Range = Tuple[int, int]


@functools.lru_cache(maxsize=256)
def plans_for(windows: Tuple[Window, ...], spatial: Tuple[int, ...], grid_shape: Tuple[int, ...],
              coords: Tuple[int, ...], what: str) -> Tuple[DimPlan, ...]:
    """This rank's plan along every spatial axis (unsplit axes count as one rank)."""
    return tuple(plan_dim(w, n, grid_shape[a] if a < len(grid_shape) else 1,
                          coords[a] if a < len(coords) else 0, what, unit_of(a, len(spatial)))
                 for a, (w, n) in enumerate(zip(windows, spatial)))


class Piece(NamedTuple):
    """A box of outputs computed by one call of the op."""

    out: Index     # into the rank's output tile
    source: Index  # into the tile itself (from_x) or into the extended tile
    crop: Index    # into the op's output (a transposed window makes more than the box)
    early: bool    # reads no halo: computable while the halo travels
    from_x: bool   # reads the tile itself (a view: nothing copied, nothing kept twice)
    pad: Tuple[int, ...]  # chainer's own padding for the call (from_x pieces only)
    target: Index  # where its input gradient lands in the extended tile


def _reading(window: Window, plan: DimPlan, low: int, high: int) -> Range:
    """Global outputs of ``plan`` whose input rows all lie in ``[low, high)``."""
    o0, o1 = plan.out
    inside = [g for g in range(o0, o1)
              if low <= window.needs(g, g + 1, plan.n)[0]
              and window.needs(g, g + 1, plan.n)[1] <= high]
    return (inside[0], inside[-1] + 1) if inside else (o0, o0)


def _interior(window: Window, plan: DimPlan) -> Range:
    """Global outputs of ``plan`` that read no halo row (edge padding allowed)."""
    return _reading(window, plan, plan.own[0] if plan.lo else -(1 << 62),
                    plan.own[1] if plan.hi else 1 << 62)


def _inside_own(window: Window, plan: DimPlan) -> Tuple[Range, int]:
    """Outputs computable from the tile itself along one axis, and chainer's padding.

    An unsplit axis whose padding chainer makes alike on both sides (no
    ``cover_all`` row beyond it) is read whole with the op's own padding;
    along any other axis, the outputs that read own rows only, padding 0.
    """
    p = window.pad
    if plan.own == (0, plan.n) and window.needs(*plan.out, plan.n) == (-p, plan.n + p):
        return plan.out, p
    return _reading(window, plan, *plan.own), 0


def _piece(windows: Sequence[Window], plans: Sequence[DimPlan], box: Sequence[Range],
           early: bool) -> Piece:
    """A piece read from the extended tile (halo and padding in it)."""
    out, source, crop = [], [], []
    for w, p, (g0, g1) in zip(windows, plans, box):
        a, b = w.needs(g0, g1, p.n)
        base = p.own[0] - p.lo - p.pad_lo
        first = w.produces(a, b)[0]
        out.append(slice(g0 - p.out[0], g1 - p.out[0]))
        source.append(slice(a - base, b - base))
        crop.append(slice(g0 - first, g1 - first))
    lead = (slice(None), slice(None))
    src = lead + tuple(source)
    return Piece(lead + tuple(out), src, lead + tuple(crop), early, False,
                 (0,) * len(plans), src)


def _own_piece(windows: Sequence[Window], plans: Sequence[DimPlan], box: Sequence[Range],
               pads: Sequence[int]) -> Piece:
    """A piece read from the tile itself, with chainer's padding where ``pads`` says."""
    out, source, crop, target = [], [], [], []
    for w, p, (g0, g1), pad in zip(windows, plans, box, pads):
        i0, i1 = p.own
        a, b = (i0, i1) if pad else w.needs(g0, g1, p.n)
        start = p.pad_lo + p.lo  # the tile's first row in the extended tile
        out.append(slice(g0 - p.out[0], g1 - p.out[0]))
        source.append(slice(a - i0, b - i0))
        crop.append(slice(0, g1 - g0))
        target.append(slice(start + a - i0, start + b - i0))
    lead = (slice(None), slice(None))
    return Piece(lead + tuple(out), lead + tuple(source), lead + tuple(crop), True, True,
                 tuple(pads), lead + tuple(target))


def _border(windows: Sequence[Window], plans: Sequence[DimPlan], inner: List[Range],
            whole: List[Range]) -> List[Piece]:
    """The slabs around ``inner``: along each axis, below and above it."""
    pieces = []
    for axis in range(len(plans)):
        for rng in ((whole[axis][0], inner[axis][0]), (inner[axis][1], whole[axis][1])):
            if rng[1] > rng[0]:
                box = inner[:axis] + [rng] + whole[axis + 1:]
                pieces.append(_piece(windows, plans, box, False))
    return pieces


@functools.lru_cache(maxsize=256)
def pieces_for(windows: Tuple[Window, ...], plans: Tuple[DimPlan, ...], overlap: bool,
               chunks: int) -> Tuple[Piece, ...]:
    """The output boxes in the order they are computed (see the module docstring).

    With overlap, the interior reads the tile itself (its graph keeps a view
    of the tile, which the layer before keeps anyway), split in ``chunks``
    along an axis read without chainer's padding; the border slabs read the
    extended tile. A transposed window's pieces all read the extended tile.
    """
    whole = [p.out for p in plans]
    halo = any(p.lo or p.hi for p in plans)
    if any(w.transposed for w in windows):
        inner = [_interior(w, p) for w, p in zip(windows, plans)]
        if not overlap or not halo or any(i1 <= i0 for i0, i1 in inner):
            return (_piece(windows, plans, whole, not halo),)
        return tuple(_chunked(windows, plans, inner, chunks, lambda box: _piece(
            windows, plans, box, True)) + _border(windows, plans, inner, whole))
    own = [_inside_own(w, p) for w, p in zip(windows, plans)]
    inner, pads = [r for r, _ in own], [pad for _, pad in own]
    if inner == whole and not halo:  # nothing to wait for
        return (_own_piece(windows, plans, whole, pads),)
    if not overlap or any(i1 <= i0 for i0, i1 in inner):
        return (_piece(windows, plans, whole, not halo),)
    early = _chunked(windows, plans, inner, chunks,
                     lambda box: _own_piece(windows, plans, box, pads), pads)
    return tuple(early + _border(windows, plans, inner, whole))


def _chunked(windows: Sequence[Window], plans: Sequence[DimPlan], inner: List[Range],
             chunks: int, make: Callable[[List[Range]], Piece],
             pads: Optional[Sequence[int]] = None) -> List[Piece]:
    """``inner`` in up to ``chunks`` pieces along its first axis read without padding."""
    axis = next((a for a in range(len(plans)) if not pads or not pads[a]), None)
    if axis is None or chunks <= 1:
        return [make(list(inner))]
    i0, i1 = inner[axis]
    bounds = np.linspace(i0, i1, min(chunks, i1 - i0) + 1).astype(int)
    return [make(inner[:axis] + [(int(c0), int(c1))] + inner[axis + 1:])
            for c0, c1 in zip(bounds[:-1], bounds[1:])]


def per_sample(pieces: Sequence[Piece], shape: Tuple[int, ...],
               plans: Sequence[DimPlan]) -> List[Piece]:
    """The pieces one sample at a time, where a sample's output is large.

    chainer's CPU convolution multiplies its im2col columns through
    ``tensordot``, which copies them transposed when the batch is larger than
    one (a large share of a step: docs/benchmarks_history.rst, "bench_spatial,
    2026-11-24"); one sample at a time it multiplies in place.
    """
    pixels = int(np.prod([p.out[1] - p.out[0] for p in plans]))
    if shape[0] < 2 or pixels < SAMPLE_PIXELS:
        return list(pieces)
    runs = []
    for piece in pieces:
        for n in range(shape[0]):
            one = (slice(n, n + 1),)
            runs.append(piece._replace(out=one + piece.out[1:],
                                       source=one + piece.source[1:],
                                       target=one + piece.target[1:]))
    return runs


SIZE_HINT = ("a size read from a tile's shape (h.shape) is the tile's, not the image's: for a "
             "global pooling use F.mean(h, axis=(2, 3)) or F.max(h, axis=(2, 3))")


def agree(windows: Sequence[Window]) -> List[int]:
    """A layer's window arguments as ints: every rank of the grid must pass the same."""
    return [int(v) if v is not None else -1 for w in windows for v in w]


class WindowOp(chainer.FunctionNode):
    """A spatial layer's node: ``op`` (chainer's, padding 0) on each piece of the tile.

    Args:
        grid: the SpatialGrid.
        windows: the window along every spatial axis of the input.
        op: ``op(x, pad, *params)`` on Variables: chainer's function with padding
            ``pad`` (a tuple; a transposed window's op ignores it).
        fill: the value of padding rows (0, or -inf for max pooling).
        what: the layer's name in errors.
        overlap: compute the interior while the halo travels.
        shape: the global input shape, where the caller has it (else gathered).
        sum_params: sum the parameters' gradients over the grid (False for
            weights sharded by output pixel).
    """

    def __init__(self, grid: SpatialGrid, windows: Sequence[Window], op: Callable[..., Any],
                 fill: float, what: str, overlap: bool = True,
                 shape: Optional[Tuple[int, ...]] = None, sum_params: bool = True) -> None:
        self.grid = grid
        self.windows = tuple(windows)
        self.op = op
        self.fill = fill
        self.what = what
        self.overlap = overlap
        self.shape = shape
        self.sum_params = sum_params

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, params = inputs[0], inputs[1:]
        shape = self.shape or self.grid.global_shape(x.shape, self.what, agree(self.windows),
                                                     SIZE_HINT)
        if len(self.windows) != len(shape) - 2:
            raise ValueError(f"{self.what}: takes {len(self.windows)} spatial axes, got a tile "
                             f"of shape {x.shape}")
        plans = plans_for(self.windows, shape[2:], self.grid.shape, self.grid.coords,
                          self.what)
        self.layout = Layout(plans)
        self.out_spatial = tuple(p.m for p in plans)
        halo_bytes = x.dtype.itemsize * sum(
            (p.lo + p.hi) * x.size // max(1, x.shape[2 + a]) for a, p in enumerate(plans))
        chunks = CHUNKS if halo_bytes > CHUNK_BYTES else 1
        self.pieces = per_sample(pieces_for(self.windows, plans, self.overlap, chunks), x.shape,
                                 plans)
        traffic = any(p.lo or p.hi or p.send_lo or p.send_hi for p in plans)
        with device_of(x):
            ext: Any = None
            if traffic or not all(piece.from_x for piece in self.pieces):
                ext = self.layout.build(x, self.fill)
            exchange = Exchange(self.grid, self.layout, ext, False, self.what) if traffic \
                else None
            self.params = [chainer.Variable(p) for p in params]
            self.sources: List[chainer.Variable] = []
            self.results: List[chainer.Variable] = []
            self.shapes: List[Tuple[int, ...]] = []
            y = None
            for piece in self.pieces:
                if exchange is not None and not piece.early:
                    exchange.finish()
                if piece.from_x:
                    data = x[piece.source]
                elif len(self.pieces) > 1:  # a copy of the thin slab: the tile is not kept twice
                    data = ext[piece.source].copy()
                else:
                    data = ext[piece.source]
                source = chainer.Variable(data)
                with chainer.force_backprop_mode():
                    result = self.op(source, piece.pad, *self.params)
                part = result.array[piece.crop]
                if y is None:
                    y = self._output(x, plans, part)
                    if y is part:  # one piece, nothing cropped: the op's array is the output
                        self._keep(source, result)
                        continue
                y[piece.out] = part
                self._keep(source, result)
                result.array = None  # the piece's graph needs no output values
                if exchange is not None:
                    exchange.progress()
            if exchange is not None:
                exchange.finish()
        self.ext_shape = self.layout.shape
        self.lead = x.shape[:2]
        return y,

    def _output(self, x: Any, plans: Sequence[DimPlan], part: Any) -> Any:
        shape = (x.shape[0], part.shape[1]) + tuple(p.out[1] - p.out[0] for p in plans)
        if len(self.pieces) == 1 and part.shape == shape and part.flags.c_contiguous:
            return part
        return get_array_module(x).empty(shape, dtype=part.dtype)

    def _keep(self, source: chainer.Variable, result: chainer.Variable) -> None:
        self.sources.append(source)
        self.results.append(result)
        self.shapes.append(result.shape)

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        no_second_order(self.what)
        gy = grad_outputs[0].array
        need_x = 0 in indexes  # not for a first layer's input: no exchange, no input gradient
        wanted = [self.params[i - 1] for i in indexes if i > 0]
        with device_of(gy):
            grads = [self._piece_grad(gy, piece, shape)
                     for piece, shape in zip(self.pieces, self.shapes)]
            g_ext: Any = None
            exchange: Optional[Exchange] = None
            if need_x:
                g_ext = get_array_module(gy).zeros(self.lead + self.ext_shape, dtype=gy.dtype)
                self._add_input_grads(g_ext, grads)
                exchange = Exchange(self.grid, self.layout, g_ext, True, self.what)
            sums: List[Any] = [None] * len(wanted)
            for i, piece in enumerate(self.pieces):
                source = [self.sources[i]] if need_x and piece.early else []
                if not source and not wanted:
                    continue
                got = list(chainer.grad([self.results[i]], source + wanted,
                                        [chainer.Variable(grads[i])]))
                if source:
                    g = got.pop(0)
                    if g is not None:
                        g_ext[piece.target] += g.array
                for k, g in enumerate(got):
                    if g is not None:
                        sums[k] = g.array if sums[k] is None else sums[k] + g.array
                if exchange is not None:
                    exchange.progress()
            if exchange is not None:
                exchange.finish()
            if self.sum_params:
                sums = self.grid.sum_arrays(sums, self.what)
            summed = [None if g is None else chainer.Variable(g) for g in sums]
            out: List[Optional[chainer.Variable]] = []
            for i in indexes:
                if i == 0:
                    own = g_ext[(slice(None), slice(None)) + self.layout.own]
                    out.append(chainer.Variable(own))
                else:
                    out.append(summed.pop(0))
        return tuple(out)

    def _piece_grad(self, gy: Any, piece: Piece, shape: Tuple[int, ...]) -> Any:
        g = gy[piece.out]
        if g.shape == shape:
            return g
        full = get_array_module(gy).zeros(shape, dtype=gy.dtype)
        full[piece.crop] = g
        return full

    def _add_input_grads(self, g_ext: Any, grads: Sequence[Any]) -> None:
        """The input gradients of the pieces that read the halo: they go out first."""
        late = [i for i, piece in enumerate(self.pieces) if not piece.early]
        if not late:
            return
        got = chainer.grad([self.results[i] for i in late], [self.sources[i] for i in late],
                           [chainer.Variable(grads[i]) for i in late])
        for i, g in zip(late, got):
            if g is not None:
                g_ext[self.pieces[i].target] += g.array
