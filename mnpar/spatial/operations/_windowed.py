"""Spatial convolutions and pooling as functions: chainer's signatures, plus ``grid=``.

Each takes a tile and returns the tile of the one-process result, by the
balanced rule: ``f(grid.tile(x), ..., grid=grid) == grid.tile(F.f(x, ...))``.
The window arithmetic is in ``_geometry``, the communication in ``_halo``
and the overlap in ``_window_op``; this module only describes each op.
"""
import functools
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import chainer
import numpy as np
from chainer.functions.connection.convolution_2d import convolution_2d as _conv2d
from chainer.functions.connection.convolution_nd import convolution_nd as _conv_nd
from chainer.functions.connection.deconvolution_2d import deconvolution_2d as _deconv2d
from chainer.functions.connection.deconvolution_nd import deconvolution_nd as _deconv_nd
from chainer.functions.pooling.average_pooling_2d import average_pooling_2d as _avg2d
from chainer.functions.pooling.average_pooling_nd import average_pooling_nd as _avg_nd
from chainer.functions.pooling.max_pooling_nd import max_pooling_2d as _max2d
from chainer.functions.pooling.max_pooling_nd import max_pooling_nd as _max_nd
from chainer.functions.pooling.unpooling_2d import unpooling_2d as _unpool2d
from chainer.functions.pooling.unpooling_nd import unpooling_nd as _unpool_nd

from .._errors import SpatialError
from .._marks import Flat, Tile, Whole, mark, mark_of, trusted
from ..traffic._geometry import Window
from ..traffic._grid import SpatialGrid, require_grid
from ..traffic._reduce import global_pool, global_window
from ._window_op import SIZE_HINT, WindowOp, agree

IntOrTuple = Union[int, Sequence[int]]


def _per_axis(value: Any, ndim: int, name: str, what: str) -> Tuple[int, ...]:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,) * ndim
    if len(items) != ndim or any(not isinstance(v, int) or isinstance(v, bool) for v in items):
        raise TypeError(f"{what}: {name}={value!r} must be an int or {ndim} ints")
    return tuple(int(v) for v in items)


def _windows(ndim: int, what: str, ksize: IntOrTuple, stride: IntOrTuple, pad: IntOrTuple,
             dilate: IntOrTuple = 1, cover_all: bool = False, transposed: bool = False,
             outsize: Optional[Sequence[Optional[int]]] = None) -> Tuple[Window, ...]:
    k = _per_axis(ksize, ndim, "ksize", what)
    s = _per_axis(stride, ndim, "stride", what)
    p = _per_axis(pad, ndim, "pad", what)
    d = _per_axis(dilate, ndim, "dilate", what)
    if min(k) < 1 or min(s) < 1 or min(p) < 0 or min(d) < 1:
        raise ValueError(f"{what}: ksize {k}, stride {s}, pad {p}, dilate {d} must be positive "
                         "(pad non-negative)")
    sizes = tuple(outsize) if outsize is not None else (None,) * ndim
    return tuple(Window(k[a], s[a], p[a], d[a], bool(cover_all), transposed, sizes[a])
                 for a in range(ndim))


def _named(kind: str, name: Optional[str]) -> str:
    return f"{kind} {name!r}" if name else kind


def _ndim(x: Any, grid: SpatialGrid, what: str) -> int:
    require_grid(grid, what)
    ndim = len(x.shape) - 2
    if ndim < max(1, grid.ndim):
        raise ValueError(f"{what}: a tile of shape {x.shape} has fewer spatial axes than the "
                         f"grid {grid.shape} splits")
    m = mark_of(x)
    if isinstance(m, (Whole, Flat)) or (isinstance(m, Tile) and m.lead(len(x.shape)) != 2):
        raise SpatialError(f"{what} receives {m.describe()}, not (N, C, *spatial) tiles: call "
                           "chainer's function on whole images (after gather)")
    return ndim


def _run(x: Any, grid: SpatialGrid, node: WindowOp, inputs: Tuple[Any, ...]) -> chainer.Variable:
    """``node`` on ``inputs``, unguarded (it does its own sums); its output marked a tile."""
    with trusted():
        y = node.apply(inputs)[0]
    return mark(y, Tile(grid, node.out_spatial[:grid.ndim], len(x.shape) - 2 - grid.ndim))


def _global(x: Any, grid: SpatialGrid, what: str, windows: Sequence[Window]) -> Tuple[int, ...]:
    """The whole input's shape (collective: the tiles and the window arguments checked)."""
    return grid.global_shape(x.shape, what, agree(windows), SIZE_HINT)


def convolution_nd(x: Any, W: Any, b: Any = None, stride: IntOrTuple = 1, pad: IntOrTuple = 0,
                   cover_all: bool = False, dilate: IntOrTuple = 1, groups: int = 1, *,
                   grid: SpatialGrid, overlap: bool = True,
                   name: Optional[str] = None) -> chainer.Variable:
    """``F.convolution_nd`` on a tile: this rank's tile of the whole image's result.

    Weight and bias gradients are summed over the grid (the whole image's).
    ``overlap=False`` waits for the halo before computing anything; ``name``
    names the layer in errors.
    """
    what = _named("spatial convolution", name)
    ndim = _ndim(x, grid, what)
    windows = _windows(ndim, what, W.shape[2:], stride, pad, dilate, cover_all)
    step = tuple(w.stride for w in windows)
    dil = tuple(w.dilate for w in windows)
    conv = _conv2d if ndim == 2 else _conv_nd

    def op(v: chainer.Variable, pad: Tuple[int, ...], W: chainer.Variable,
           b: Optional[chainer.Variable] = None) -> chainer.Variable:
        return conv(v, W, b, stride=step, pad=pad, dilate=dil, groups=groups)
    inputs = (x, W) if b is None else (x, W, b)
    return _run(x, grid, WindowOp(grid, windows, op, 0.0, what, overlap), inputs)


def deconvolution_nd(x: Any, W: Any, b: Any = None, stride: IntOrTuple = 1,
                     pad: IntOrTuple = 0, outsize: Optional[Sequence[int]] = None,
                     dilate: IntOrTuple = 1, groups: int = 1, *, grid: SpatialGrid,
                     overlap: bool = True, name: Optional[str] = None) -> chainer.Variable:
    """``F.deconvolution_nd`` on a tile; ``outsize`` is the whole image's, as in chainer."""
    what = _named("spatial deconvolution", name)
    ndim = _ndim(x, grid, what)
    windows = _windows(ndim, what, W.shape[2:], stride, pad, dilate, transposed=True,
                       outsize=outsize)
    step = tuple(w.stride for w in windows)
    dil = tuple(w.dilate for w in windows)
    deconv = _deconv2d if ndim == 2 else _deconv_nd

    def op(v: chainer.Variable, pad: Tuple[int, ...], W: chainer.Variable,
           b: Optional[chainer.Variable] = None) -> chainer.Variable:
        # transposed: the padding is in the extended tile
        return deconv(v, W, b, stride=step, pad=0, dilate=dil, groups=groups)
    inputs = (x, W) if b is None else (x, W, b)
    return _run(x, grid, WindowOp(grid, windows, op, 0.0, what, overlap), inputs)


def max_pooling_nd(x: Any, ksize: IntOrTuple, stride: Optional[IntOrTuple] = None,
                   pad: IntOrTuple = 0, cover_all: bool = True, *, grid: SpatialGrid,
                   overlap: bool = True) -> chainer.Variable:
    """``F.max_pooling_nd`` on a tile (padding is -inf, as in chainer)."""
    what = "spatial max pooling"
    windows = _pooling_windows(x, grid, what, ksize, stride, pad, cover_all)
    pool = functools.partial(_max2d if len(windows) == 2 else _max_nd, cover_all=False)
    return _pooled(x, grid, what, windows, pool, -float("inf"), lambda box: ("max", 1), overlap)


def average_pooling_nd(x: Any, ksize: IntOrTuple, stride: Optional[IntOrTuple] = None,
                       pad: IntOrTuple = 0, pad_value: Optional[float] = 0, *,
                       grid: SpatialGrid, overlap: bool = True) -> chainer.Variable:
    """``F.average_pooling_nd`` on a tile.

    Padding counts as ``pad_value`` 0, as in chainer (``average_pooling_2d``
    always divides by the whole window); ``pad_value=None`` (averaging over
    the image's pixels only) is supported only without padding.
    """
    what = "spatial average pooling"
    windows = _pooling_windows(x, grid, what, ksize, stride, pad, False)
    if pad_value is None and any(w.pad for w in windows):
        raise ValueError(f"{what}: pad_value=None with pad {tuple(w.pad for w in windows)} is "
                         "not supported; use pad_value=0 or pad=0")
    if pad_value not in (None, 0):
        raise ValueError(f"{what}: pad_value={pad_value!r} must be 0 or None, as in chainer")
    window = int(np.prod([w.ksize for w in windows]))

    def divisor(box: Sequence[Tuple[int, int]]) -> Tuple[str, int]:
        return "sum", window if pad_value is not None else int(np.prod([b - a for a, b in box]))
    pool = _avg2d if len(windows) == 2 else _avg_nd
    return _pooled(x, grid, what, windows, pool, 0.0, divisor, overlap)


def _pooling_windows(x: Any, grid: SpatialGrid, what: str, ksize: IntOrTuple,
                     stride: Optional[IntOrTuple], pad: IntOrTuple,
                     cover_all: bool) -> Tuple[Window, ...]:
    """A pooling's windows (the stride is the kernel's by default, as in chainer)."""
    return _windows(_ndim(x, grid, what), what, ksize, ksize if stride is None else stride,
                    pad, cover_all=cover_all)


def _pooled(x: Any, grid: SpatialGrid, what: str, windows: Tuple[Window, ...],
            pool: Callable[..., chainer.Variable], fill: float,
            whole: Callable[[Sequence[Tuple[int, int]]], Tuple[str, int]],
            overlap: bool) -> chainer.Variable:
    """A pooling on a tile: one window over the whole image is a reduction over the grid
    (``whole(box)``: its op and divisor), any other runs ``pool(v, ksize, stride, pad)`` on
    each piece of the tile, ``fill`` in the padding."""
    shape = _global(x, grid, what, windows)
    box = global_window(windows, shape[2:])
    if box is not None:
        op, divisor = whole(box)
        with trusted():
            return global_pool(x, grid, shape[2:], box, op, divisor)
    k = tuple(w.ksize for w in windows)
    step = tuple(w.stride for w in windows)

    def run(v: chainer.Variable, pad: Tuple[int, ...]) -> chainer.Variable:
        return pool(v, k, step, pad)
    return _run(x, grid, WindowOp(grid, windows, run, fill, what, overlap, shape), (x,))


def convolution_2d(x: Any, W: Any, b: Any = None, stride: IntOrTuple = 1, pad: IntOrTuple = 0,
                   cover_all: bool = False, *, grid: SpatialGrid, dilate: IntOrTuple = 1,
                   groups: int = 1, overlap: bool = True) -> chainer.Variable:
    """``F.convolution_2d`` on a tile (``convolution_nd`` with chainer's 2-D signature)."""
    return convolution_nd(x, W, b, stride, pad, cover_all, dilate, groups, grid=grid,
                          overlap=overlap)


def deconvolution_2d(x: Any, W: Any, b: Any = None, stride: IntOrTuple = 1,
                     pad: IntOrTuple = 0, outsize: Optional[Sequence[int]] = None, *,
                     grid: SpatialGrid, dilate: IntOrTuple = 1, groups: int = 1,
                     overlap: bool = True) -> chainer.Variable:
    """``F.deconvolution_2d`` on a tile (``deconvolution_nd`` with the 2-D signature)."""
    return deconvolution_nd(x, W, b, stride, pad, outsize, dilate, groups, grid=grid,
                            overlap=overlap)


def max_pooling_2d(x: Any, ksize: IntOrTuple, stride: Optional[IntOrTuple] = None,
                   pad: IntOrTuple = 0, cover_all: bool = True, *, grid: SpatialGrid,
                   overlap: bool = True) -> chainer.Variable:
    """``F.max_pooling_2d`` on a tile."""
    return max_pooling_nd(x, ksize, stride, pad, cover_all, grid=grid, overlap=overlap)


def average_pooling_2d(x: Any, ksize: IntOrTuple, stride: Optional[IntOrTuple] = None,
                       pad: IntOrTuple = 0, *, grid: SpatialGrid,
                       overlap: bool = True) -> chainer.Variable:
    """``F.average_pooling_2d`` on a tile."""
    return average_pooling_nd(x, ksize, stride, pad, 0, grid=grid, overlap=overlap)


def unpooling_nd(x: Any, ksize: IntOrTuple, stride: Optional[IntOrTuple] = None,
                 pad: IntOrTuple = 0, outsize: Optional[Sequence[int]] = None,
                 cover_all: bool = True, *, grid: SpatialGrid,
                 overlap: bool = True) -> chainer.Variable:
    """``F.unpooling_nd`` on a tile (``outsize`` is the whole image's, as in chainer).

    Each input pixel fills a ``ksize`` window of the output; where windows
    overlap they add up. A transposed window, like a deconvolution's.
    """
    what = "spatial unpooling"
    ndim = _ndim(x, grid, what)
    windows = _windows(ndim, what, ksize, ksize if stride is None else stride, pad,
                       cover_all=cover_all, transposed=True, outsize=outsize)
    k = tuple(w.ksize for w in windows)
    step = tuple(w.stride for w in windows)
    unpool = _unpool2d if ndim == 2 else _unpool_nd

    def op(v: chainer.Variable, pad: Tuple[int, ...]) -> chainer.Variable:
        # transposed: the padding is in the extended tile
        return unpool(v, k, step, 0, cover_all=False)
    return _run(x, grid, WindowOp(grid, windows, op, 0.0, what, overlap), (x,))


def unpooling_2d(x: Any, ksize: IntOrTuple, stride: Optional[IntOrTuple] = None,
                 pad: IntOrTuple = 0, outsize: Optional[Sequence[int]] = None,
                 cover_all: bool = True, *, grid: SpatialGrid,
                 overlap: bool = True) -> chainer.Variable:
    """``F.unpooling_2d`` on a tile."""
    return unpooling_nd(x, ksize, stride, pad, outsize, cover_all, grid=grid, overlap=overlap)


def convolution_1d(x: Any, W: Any, b: Any = None, stride: IntOrTuple = 1, pad: IntOrTuple = 0,
                   cover_all: bool = False, dilate: IntOrTuple = 1, groups: int = 1, *,
                   grid: SpatialGrid, overlap: bool = True) -> chainer.Variable:
    """``F.convolution_1d`` on a tile (signals split along their one axis)."""
    return convolution_nd(x, W, b, stride, pad, cover_all, dilate, groups, grid=grid,
                          overlap=overlap)


convolution_3d = convolution_1d


def deconvolution_1d(x: Any, W: Any, b: Any = None, stride: IntOrTuple = 1,
                     pad: IntOrTuple = 0, outsize: Optional[Sequence[int]] = None,
                     dilate: IntOrTuple = 1, groups: int = 1, *, grid: SpatialGrid,
                     overlap: bool = True) -> chainer.Variable:
    """``F.deconvolution_1d`` (and ``_3d``) on a tile."""
    return deconvolution_nd(x, W, b, stride, pad, outsize, dilate, groups, grid=grid,
                            overlap=overlap)


deconvolution_3d = deconvolution_1d


def max_pooling_1d(x: Any, ksize: IntOrTuple, stride: Optional[IntOrTuple] = None,
                   pad: IntOrTuple = 0, cover_all: bool = True, *, grid: SpatialGrid,
                   overlap: bool = True) -> chainer.Variable:
    """``F.max_pooling_1d`` (and ``_3d``) on a tile."""
    return max_pooling_nd(x, ksize, stride, pad, cover_all, grid=grid, overlap=overlap)


max_pooling_3d = max_pooling_1d


def average_pooling_1d(x: Any, ksize: IntOrTuple, stride: Optional[IntOrTuple] = None,
                       pad: IntOrTuple = 0, pad_value: Optional[float] = 0, *, grid: SpatialGrid,
                       overlap: bool = True) -> chainer.Variable:
    """``F.average_pooling_1d`` (and ``_3d``) on a tile."""
    return average_pooling_nd(x, ksize, stride, pad, pad_value, grid=grid, overlap=overlap)


average_pooling_3d = average_pooling_1d


def dilated_convolution_2d(x: Any, W: Any, b: Any = None, stride: IntOrTuple = 1,
                           pad: IntOrTuple = 0, dilate: IntOrTuple = 1, cover_all: bool = False,
                           *, grid: SpatialGrid, overlap: bool = True) -> chainer.Variable:
    """``F.dilated_convolution_2d`` on a tile."""
    return convolution_nd(x, W, b, stride, pad, cover_all, dilate, 1, grid=grid,
                          overlap=overlap)
