"""Local filtering: a locally connected layer whose untied weights are cut by output pixel.

``L.LocalConvolution2D`` has one filter per output pixel: ``W`` is
``(out_C, out_H, out_W, in_C, kH, kW)`` and ``b`` ``(out_C, out_H, out_W)``.
A rank computes only its output tile, so it needs only those filters; the
spatial link keeps them (memory W/P, neon's ``LocalFilteringLayerDist``)
and their gradients are its own, never summed. The input window works as
a convolution's (kernel, stride, no padding): the halo comes from the
neighbours, and chainer's own ``local_convolution_2d`` runs on the
extended tile with this rank's filters::

    W[:, o_h0:o_h1, o_w0:o_w1]  x  extended tile  ->  output tile [o_h0:o_h1, o_w0:o_w1]

Chainer's ``F.local_convolution_2d`` on a tile inside a converted model runs
the same with the whole ``W`` (its gradient summed over the grid).
"""
from typing import Any, Callable, Optional, Tuple

import chainer
import chainer.links as L
from chainer.functions.connection.local_convolution_2d import (
    local_convolution_2d as _local_conv,
)

from .._errors import SpatialError
from .._marks import Flat, Tile, Whole, mark_of, state, trusted, whole_image
from ..traffic._grid import SpatialGrid, require_grid
from ..traffic._sums import sum_grads
from ._links import _OnGrid
from ._shards import HINT, Sharded
from ._window_op import WindowOp, agree
from ._windowed import _run, _windows


def _pair(v: Any) -> Tuple[int, int]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _own(grid: SpatialGrid, out_hw: Tuple[int, ...]) -> Tuple[slice, slice]:
    slices = grid.tile_slices(out_hw)
    return slices[0], slices[1]


def local_convolution_2d(x: Any, W: Any, b: Any = None, stride: Any = 1, *, grid: SpatialGrid,
                         sharded: bool = False, agree_with: Tuple[int, ...] = (),
                         check: Optional[Callable[[], None]] = None, hint: str = "",
                         name: Optional[str] = None) -> chainer.Variable:
    """``F.local_convolution_2d`` on a tile: this rank's tile of the whole image's result.

    ``W`` and ``b`` are the whole layer's (their gradients are summed over the
    grid), or with ``sharded=True`` this rank's part, ``W[:, rows, cols]``
    for its output tile (gradients its own).
    """
    what = f"spatial local convolution {name!r}" if name else "spatial local convolution"
    require_grid(grid, what)
    m = mark_of(x)
    if isinstance(m, (Whole, Flat)) or len(x.shape) != 4 or grid.ndim > 2 or \
            (isinstance(m, Tile) and m.lead(4) != 2):
        raise SpatialError(f"{what} takes (N, C, H, W) tiles split along H and W")
    kh, kw = W.shape[-2:]
    windows = _windows(2, what, (kh, kw), _pair(stride), 0)
    shape = grid.global_shape(x.shape, what, agree(windows) + list(agree_with), hint)
    if check is not None:  # after the collective: every rank has passed it
        check()
    out_hw = tuple(w.out_size(n) for w, n in zip(windows, shape[2:]))
    rows, cols = _own(grid, out_hw)
    sy, sx = (w.stride for w in windows)
    with trusted():
        if not sharded:
            if tuple(W.shape[1:3]) != out_hw:
                raise SpatialError(f"{what}: W is for outputs {tuple(W.shape[1:3])}, the image's "
                                   f"are {out_hw}")
            W, b = (sum_grads(grid, (W,), what)[0][:, rows, cols],
                    None if b is None else sum_grads(grid, (b,), what)[0][:, rows, cols])
        elif tuple(W.shape[1:3]) != (rows.stop - rows.start, cols.stop - cols.start):
            raise SpatialError(f"{what}: this rank's filters are for {tuple(W.shape[1:3])} "
                               f"outputs, its output tile has "
                               f"{(rows.stop - rows.start, cols.stop - cols.start)}")

    def op(v: chainer.Variable, pad: Tuple[int, ...], W: chainer.Variable,
           b: Optional[chainer.Variable] = None) -> chainer.Variable:
        return _local_conv(v, W, b, (sy, sx))
    inputs = (x, W) if b is None else (x, W, b)
    node = WindowOp(grid, windows, op, 0.0, what, overlap=False, shape=shape, sum_params=False)
    return _run(x, grid, node, inputs)


class LocalConvolution2D(Sharded, _OnGrid, L.LocalConvolution2D):
    """``chainer.links.LocalConvolution2D`` on tiles, each rank holding its output tile's filters.

    Its arguments, plus ``grid``; ``in_size`` is the whole image's. Once
    ``W`` exists (at construction with ``in_size``, else at the first forward,
    drawn whole so the values are one process's), the link keeps only this
    rank's filters and biases. Snapshots hold each rank's own; resume each
    rank from its own file.

    Example::

        lf = mnpar.spatial.LocalConvolution2D(1, 8, (28, 28), 5, grid=grid)
        y = lf(x_tile)                      # == grid.tile(L.LocalConvolution2D(...)(x))
    """

    sharded_names = ("W", "b")

    def __init__(self, in_channels: Any, out_channels: Any, in_size: Any = None,
                 ksize: Any = None, stride: Any = 1, nobias: bool = False,
                 initialW: Any = None, initial_bias: Any = None, *, grid: SpatialGrid) -> None:
        super().__init__(in_channels, out_channels, in_size, ksize, stride, nobias, initialW,
                         initial_bias)
        self._on_grid(grid, True)

    def _on_grid(self, grid: SpatialGrid, overlap: bool) -> None:
        super()._on_grid(grid, overlap)
        if not hasattr(self, "shard"):
            self._init_shard()
        if self.W.array is not None and not self.is_sharded:
            self._cut()

    def _cut(self) -> None:
        if self.grid.ndim > 2:
            raise SpatialError(f"spatial local convolution: a grid of {self.grid.ndim} axes "
                               "for 2-D images")
        out_hw = tuple(self.W.shape[1:3])
        rows, cols = _own(self.grid, out_hw)
        W: Any = self.W.array
        parts = {"W": W[:, rows, cols]}
        if self.b is not None:
            b: Any = self.b.array
            parts["b"] = b[:, rows, cols]
        self._set_shards(parts, out_hw)

    def forward(self, x: Any) -> chainer.Variable:
        m = mark_of(x)
        what = f"spatial LocalConvolution2D {self.name!r}" if self.name else \
            "spatial LocalConvolution2D"
        tile = not whole_image(x) and (isinstance(m, Tile) or (m is None and not state.scopes))
        if not tile:
            self._whole_only(what)
            return super().forward(x)
        if self.W.array is None:
            shape = self.grid.global_shape(x.shape, what)
            self._initialize_params(x.shape[1], shape[2:])
        if not self.is_sharded:
            self._cut()
        return local_convolution_2d(x, self.W, self.b, self.stride, grid=self.grid,
                                    sharded=True, agree_with=(self._mine(),),
                                    check=lambda: self._check_mine(what), hint=HINT,
                                    name=self.name)
