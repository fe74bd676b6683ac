"""The guard's rules for functions that have a spatial version, and their conversions.

Each ``*_rule`` looks at a chainer node about to run on a tile and answers
like the rules in ``_rules``: exact as it is (the node's arguments leave the
split axes alone), converted (the spatial implementation computes the whole
image's result, in global coordinates), or refused. The implementations
live in their own modules; this one only reads chainer's node attributes.
"""
from typing import Any, List, Optional, Tuple

import numpy as np

from . import _reduce
from ._call import GATHER, Call, Refusal, Verdict
from ._geometry import GeometryError, split
from ._layout import placed, resolve
from ._marks import Flat, Tile, mark, trusted
from ._rows import take_rows

resolve_shape = resolve


def _out(mark_: Any) -> Any:
    return lambda outputs: [mark_] * len(outputs)


def _reduce_call(call: Call, op: str, mean: bool = False) -> Any:
    node = call.node
    if isinstance(call.mark, Flat):
        return (_reduce.reduce_flat(call.x, call.mark, op, node.axis, node.keepdims, mean),)
    return (_reduce.reduce_tile(call.x, call.tile, op, node.axis, node.keepdims, mean),)


def grid_sum(call: Call) -> Any:
    return _reduce_call(call, "sum")


def grid_mean(call: Call) -> Any:
    return _reduce_call(call, "sum", mean=True)


def grid_max(call: Call) -> Any:
    return _reduce_call(call, "max")


def grid_min(call: Call) -> Any:
    return _reduce_call(call, "min")


def rows_of(tile: Tile, axis_index: int, m: int, what: str) -> None:
    """Raises where ``m`` output rows cannot be split over the grid's ranks along the axis."""
    parts = tile.grid.shape[axis_index]
    if m < parts:
        raise GeometryError(f"{what}: the output has {m} rows along split axis {axis_index}, "
                            f"fewer than the {parts} ranks that split it")


def _take(x: Any, tile: Tile, ndim: int, axis_index: int, sources: np.ndarray, fill: float,
          interior: Optional[np.ndarray], what: str) -> Any:
    """Output rows ``sources`` (global, -1 for ``fill``) of split axis ``axis_index``."""
    parts = tile.grid.shape[axis_index]
    m = len(sources)
    rows_of(tile, axis_index, m, what)

    def mine(c: int) -> np.ndarray:
        lo, hi = split(m, parts, c)
        return sources[lo:hi]

    no_grad = None
    if interior is not None:
        mask = ~interior

        def no_grad(c: int) -> np.ndarray:
            lo, hi = split(m, parts, c)
            return mask[lo:hi]

    position = tile.split_axes(ndim)[axis_index]
    return take_rows(x, tile.grid, position, axis_index, tile.extents[axis_index], mine, fill,
                     no_grad, what)


def _with_extent(tile: Tile, axis_index: int, n: int) -> Tile:
    extents = list(tile.extents)
    extents[axis_index] = n
    return Tile(tile.grid, tuple(extents), tile.tail)


def flip_rule(call: Call) -> Verdict:
    name = type(call.node).__name__
    axis: int = {"FlipLR": 1, "FlipUD": 0}.get(name, getattr(call.node, "axis", 0))
    tile = call.tile
    axis = int(axis) % call.ndim
    split_axes = tile.split_axes(call.ndim)
    if axis not in split_axes:
        return Verdict(_out(tile))
    k = split_axes.index(axis)

    def convert() -> Tuple[Any]:
        n = tile.extents[k]
        with trusted():
            y = _take(call.x, tile, call.ndim, k, np.arange(n)[::-1], 0.0, None, "spatial flip")
        return (mark(y, tile),)
    return Verdict(convert=convert)


def _basic(items: Tuple[Any, ...], ndim: int) -> List[Any]:
    """``items`` with the Ellipsis expanded; raises on advanced indexing."""
    for s in items:
        if not (s is None or s is Ellipsis or isinstance(s, (int, np.integer, slice))) or \
                isinstance(s, bool):
            raise Refusal("it indexes a tile with arrays (advanced indexing)", GATHER)
    real = sum(1 for s in items if s is not None and s is not Ellipsis)
    out: List[Any] = []
    for s in items:
        if s is Ellipsis:
            out.extend([slice(None)] * (ndim - real))
        else:
            out.append(s)
    if Ellipsis not in items:
        out.extend([slice(None)] * (ndim - real))
    return out


def get_item_rule(call: Call) -> Verdict:
    tile = call.tile
    items = _basic(tuple(call.node.slices), call.ndim)
    split_axes = tile.split_axes(call.ndim)
    in_axis, out_axis, positions, cuts = 0, 0, [], {}
    for s in items:
        if s is None:
            out_axis += 1
            continue
        if in_axis in split_axes:
            k = split_axes.index(in_axis)
            if not isinstance(s, slice):
                raise Refusal(f"it picks one row of split axis {in_axis}", GATHER)
            if s.indices(tile.extents[k]) != (0, tile.extents[k], 1):
                cuts[k] = s
            positions.append(out_axis)
        if isinstance(s, slice):
            out_axis += 1
        in_axis += 1
    out_ndim = out_axis
    result = placed(tile, out_ndim, positions, "the index")
    if not cuts:
        return Verdict(_out(result))
    if any(not isinstance(s, slice) for s in items):
        raise Refusal("it slices a split axis and also picks or adds axes", "slice first, then "
                      "pick: h[:, :, a:b][:, 0]")

    def convert() -> Tuple[Any]:
        local = tuple(slice(None) if a in split_axes else s for a, s in enumerate(items))
        extents = list(tile.extents)
        with trusted():
            y = call.x[local] if any(s != slice(None) for s in local) else call.x
            for k, s in sorted(cuts.items()):
                rows = np.arange(tile.extents[k])[s]
                y = _take(y, tile, call.ndim, k, rows, 0.0, None, "spatial slice")
                extents[k] = len(rows)
        return (mark(y, Tile(tile.grid, tuple(extents), tile.tail)),)
    return Verdict(convert=convert)


PAD_MODES = ("constant", "edge", "wrap", "reflect", "symmetric")


def pad_rule(call: Call) -> Verdict:
    tile = call.tile
    node = call.node
    widths = np.broadcast_to(np.asarray(node.pad_width, dtype=np.int64), (call.ndim, 2))
    split_axes = tile.split_axes(call.ndim)
    padded = [k for k, a in enumerate(split_axes) if widths[a].any()]
    if not padded:
        return Verdict(_out(tile))
    mode = node.mode
    value = node.keywords.get("constant_values", 0)
    if mode not in PAD_MODES or (mode == "constant" and np.ndim(value) != 0):
        raise Refusal(f"mode={mode!r}" + (f" with constant_values={value!r}" if mode == "constant"
                                           else "") + " is not supported along split axes",
                      f"use one of {PAD_MODES} (a scalar constant_values), or " + GATHER)
    if any(k in node.keywords for k in ("reflect_type", "stat_length", "end_values")):
        raise Refusal(f"the options {sorted(node.keywords)} are not supported along split "
                      "axes", GATHER)

    def convert() -> Tuple[Any]:
        import chainer.functions as F

        extents = list(tile.extents)
        y = call.x
        with trusted():
            for k in padded:
                lo, hi = (int(v) for v in widths[split_axes[k]])
                n = tile.extents[k]
                kw = {"constant_values": -1} if mode == "constant" else {}
                sources = np.pad(np.arange(n), (lo, hi), mode=mode, **kw)
                interior = np.zeros(len(sources), bool)
                interior[lo:lo + n] = True
                y = _take(y, tile, call.ndim, k, sources, float(value), interior, "spatial pad")
                extents[k] = n + lo + hi
            rest = widths.copy()
            rest[list(split_axes)] = 0
            if rest.any():
                y = F.pad(y, rest, mode, **node.keywords)
        return (mark(y, Tile(tile.grid, tuple(extents), tile.tail)),)
    return Verdict(convert=convert)


def _image(call: Call, what: str) -> Tile:
    tile = call.tile
    if tile.lead(call.ndim) != 2:
        raise Refusal(f"{what} needs (N, C, *spatial) tiles; this one has the split axes at "
                      f"{tile.split_axes(call.ndim)}", GATHER)
    return tile


def unpooling_rule(call: Call) -> Verdict:
    from ._functions import unpooling_nd

    tile = _image(call, "unpooling")
    node = call.node
    if hasattr(node, "kh"):
        ksize, stride, pad = (node.kh, node.kw), (node.sy, node.sx), (node.ph, node.pw)
        outsize = None if node.outh is None else (node.outh, node.outw)
    else:
        ksize, stride, pad, outsize = node.ksize, node.stride, node.pad, node.outs

    def convert() -> Tuple[Any]:
        return (unpooling_nd(call.x, ksize, stride, pad, outsize, node.cover_all,
                             grid=tile.grid),)
    return Verdict(convert=convert)


def resize_rule(call: Call) -> Verdict:
    from ._resize import resize_images

    tile = _image(call, "resize_images")
    node = call.node

    def convert() -> Tuple[Any]:
        return (resize_images(call.x, (node.out_H, node.out_W), mode=node.mode,
                              align_corners=node.align_corners, grid=tile.grid),)
    return Verdict(convert=convert)


def group_norm_rule(call: Call) -> Verdict:
    from ._norms import group_normalization

    tile = _image(call, "group normalization")
    x, gamma, beta = call.inputs

    def convert() -> Tuple[Any]:
        return (group_normalization(x, call.node.groups, gamma, beta, call.node.eps,
                                    grid=tile.grid),)
    return Verdict(convert=convert)


def layer_norm_rule(call: Call) -> Verdict:
    from ._norms import flat_layer_normalization

    if not isinstance(call.mark, Flat) or call.first != 0:
        raise Refusal(f"it receives {call.mark.describe()}", GATHER)
    x, gamma, beta = call.inputs

    def convert() -> Tuple[Any]:
        return (flat_layer_normalization(x, call.mark, gamma, beta, call.node.eps),)
    return Verdict(convert=convert)


def linear_rule(call: Call) -> Verdict:
    from ._tower import flat_linear

    if not isinstance(call.mark, Flat) or call.first != 0:
        raise Refusal(f"it receives {call.mark.describe()} as weights", GATHER)

    def convert() -> Tuple[Any]:
        return (flat_linear(call.inputs[0], call.mark, *call.inputs[1:]),)
    return Verdict(convert=convert)


def local_conv_rule(call: Call) -> Verdict:
    from ._local import local_convolution_2d

    tile = _image(call, "local convolution")
    if call.first != 0:
        raise Refusal("a tile arrives as its weights", GATHER)
    node = call.node

    def convert() -> Tuple[Any]:
        W = call.inputs[1]
        b = call.inputs[2] if len(call.inputs) > 2 else None
        return (local_convolution_2d(call.x, W, b, (node.sy, node.sx), grid=tile.grid),)
    return Verdict(convert=convert)

