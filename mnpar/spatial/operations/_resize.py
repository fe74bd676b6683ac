"""``resize_images`` in global coordinates: each output pixel reads the input pixels
chainer's would, wherever they are.

Chainer maps output row ``i`` of ``out_H`` to the input coordinate ``v(i)``
(``align_corners``: ``i (H - 1) / (out_H - 1)``; else ``(i + 0.5) H / out_H
- 0.5``, at least 0; nearest: ``floor(i H / out_H)``) and interpolates rows
``floor(v)`` and ``floor(v) + 1`` (the last row repeats). A rank's output
rows read one contiguous band of input rows, which may lie on any rank of
its line of the grid; ``TakeRows`` brings the band, and chainer's own
interpolation runs on it with the coordinates shifted to the band::

    global  v(i) for the rank's output rows [o0, o1)  ->  band [a, b) of input rows
    local   chainer's bilinear on band, rows v(i) - a, weights as chainer computes them

The weights and the arithmetic are chainer's, so the result is its result.
"""
from typing import Any, Tuple

import chainer
import numpy as np
from chainer.functions.array import resize_images as _chainer

from ..._arrays import get_array_module
from .._errors import SpatialError
from .._marks import Flat, Tile, Whole, mark, mark_of, trusted
from ..traffic._geometry import split
from ..traffic._grid import SpatialGrid, require_grid
from ..traffic._rows import take_rows


def coordinates(n: int, m: int, mode: str, align_corners: bool) -> Tuple[Any, Any]:
    """Chainer's input row (int) and weight (float64) of each of ``m`` outputs from ``n`` rows."""
    if mode == "bilinear":
        if align_corners:
            v = np.linspace(0, n - 1, num=m, dtype=np.float64)
        else:
            v = np.maximum((np.arange(m, dtype=np.float64) + 0.5) * (n / m) - 0.5, 0)
        w, v = np.modf(v)
    elif mode == "nearest":
        v = np.minimum(np.floor(np.arange(m, dtype=np.float64) * (n / m)), n - 1)
        w = np.zeros_like(v)
    else:
        raise ValueError(f"resize_images: mode={mode!r} is not 'bilinear' or 'nearest'")
    return v.astype(np.intp), w


class Interpolate(chainer.FunctionNode):
    """Chainer's bilinear interpolation at given rows ``v``, columns ``u`` and weights."""

    def __init__(self, v: Any, u: Any, vw: Any, uw: Any) -> None:
        self.v, self.u, self.vw, self.uw = v, u, vw, uw

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, = inputs
        self.shape = x.shape
        xp = get_array_module(x)
        v, u, vw, uw = (xp.asarray(a) for a in (self.v, self.u, self.vw, self.uw))
        vw, uw = vw.astype(x.dtype), uw.astype(x.dtype)
        v, u, vw, uw = xp.broadcast_arrays(v[:, None], u[None, :], vw[:, None], uw[None, :])
        self.args = (v, u, vw, uw)
        if xp is np:
            return _chainer.interpolate_bilinear_cpu(x, v, u, vw, uw),
        return _chainer.interpolate_bilinear_gpu(x, v, u, vw, uw),

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        gy = grad_outputs[0].array
        H, W = self.shape[2:]
        grad = _chainer.interpolate_grad_bilinear_cpu if get_array_module(gy) is np else \
            _chainer.interpolate_grad_bilinear_gpu
        return chainer.Variable(grad(gy, *self.args, H, W)),


def resize_images(x: Any, output_shape: Tuple[int, int], *, mode: str = "bilinear",
                  align_corners: bool = True, grid: SpatialGrid) -> chainer.Variable:
    """``F.resize_images`` of the whole image, on this rank's tile (``output_shape`` is the
    whole output's)."""
    what = "spatial resize_images"
    require_grid(grid, what)
    m = mark_of(x)
    if isinstance(m, (Whole, Flat)) or len(x.shape) != 4 or grid.ndim > 2:
        raise SpatialError(f"{what} takes (N, C, H, W) tiles")
    out = tuple(int(v) for v in output_shape)
    whole = grid.global_shape(x.shape, what, list(out) + [int(align_corners),
                                                           int(mode == "nearest")])
    index, weight = [], []
    y = x
    with trusted():
        for axis in range(2):
            n, m_out = whole[2 + axis], out[axis]
            v, w = coordinates(n, m_out, mode, align_corners)
            if axis >= grid.ndim:
                index.append(v)
                weight.append(w)
                continue
            parts = grid.shape[axis]
            if m_out < parts:
                raise SpatialError(f"{what}: {m_out} output rows along split axis {axis} for "
                                   f"{parts} ranks")
            bands = [_band(v, n, *split(m_out, parts, c)) for c in range(parts)]
            o0, o1 = split(m_out, parts, grid.coords[axis])
            a = bands[grid.coords[axis]][0]
            y = take_rows(y, grid, 2 + axis, axis, n, _rows_of(bands), 0.0, None, what)
            index.append(v[o0:o1] - a)
            weight.append(w[o0:o1])
        y = Interpolate(index[0], index[1], weight[0], weight[1]).apply((y,))[0]
    extents = out[:grid.ndim]
    return mark(y, Tile(grid, extents, 2 - grid.ndim)) if m is not None else y


def _rows_of(bands: Any) -> Any:
    return lambda c: np.arange(*bands[c])


def _band(v: Any, n: int, o0: int, o1: int) -> Tuple[int, int]:
    """The input rows ``[a, b)`` that outputs ``[o0, o1)`` read."""
    rows = v[o0:o1]
    return int(rows.min()), int(min(rows.max() + 1, n - 1)) + 1
