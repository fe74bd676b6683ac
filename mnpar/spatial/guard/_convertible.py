"""The guard's conversions that move rows or reduce over the grid: reductions over the
split axes, flips, slices and padding along them.

Each ``*_rule`` looks at a chainer node about to run on a tile and answers
like the rules in ``_rules``: exact as it is (the node's arguments leave the
split axes alone), converted (rows moved between the ranks, or a reduction
over the grid, compute the whole image's result in global coordinates), or
refused. Rules that hand a node to a spatial layer of ``operations/`` are
``_versions``'.
"""
from typing import Any, List, Optional, Tuple

import chainer
import numpy as np

from .._marks import Flat, Tile, Whole, mark, trusted
from ..traffic._geometry import GeometryError, split
from ..traffic._reduce import GridReduce
from ..traffic._rows import take_rows
from ._call import GATHER, Call, Refusal, Verdict
from ._layout import placed


def _out(mark_: Any) -> Any:
    return lambda outputs: [mark_] * len(outputs)


def reduce_tile(x: Any, tile: Tile, op: str, axis: Any, keepdims: bool,
                mean: bool = False) -> chainer.Variable:
    """``op`` over ``axis`` (which must hold every split axis) of a tile: the whole image's."""
    ndim = len(x.shape)
    axes = tuple(range(ndim)) if axis is None else tuple(
        sorted(int(a) % ndim for a in (axis if isinstance(axis, (tuple, list)) else (axis,))))
    split = tile.split_axes(ndim)
    missing = [a for a in split if a not in axes]
    if missing:
        raise Refusal(f"it reduces over some of the split axes {split} but not {missing}; the "
                      "result would be tiled along some and repeated along others",
                      f"reduce over all split axes at once (axis={tuple(split)}), or " + GATHER)
    scale = 1.0
    if mean:
        count = int(np.prod([tile.global_shape(tuple(x.shape))[a] for a in axes]))
        scale = 1.0 / count
    y = GridReduce(tile.grid, op, axes, keepdims, scale).apply((x,))[0]
    return mark(y, Whole(tile.grid))


def reduce_flat(x: Any, flat: Flat, op: str, axis: Any, keepdims: bool,
                mean: bool = False) -> chainer.Variable:
    """``op`` over a flattened tile's features (and maybe its batch): the whole image's."""
    axes = tuple(range(2)) if axis is None else tuple(
        sorted(int(a) % 2 for a in (axis if isinstance(axis, (tuple, list)) else (axis,))))
    if 1 not in axes:
        raise Refusal("it reduces the batch of a flattened tile, keeping its features", GATHER)
    scale = 1.0
    if mean:
        scale = 1.0 / (int(np.prod(flat.block)) * (x.shape[0] if 0 in axes else 1))
    y = GridReduce(flat.grid, op, axes, keepdims, scale).apply((x,))[0]
    return mark(y, Whole(flat.grid))


def _reduce_call(call: Call, op: str, mean: bool = False) -> Any:
    node = call.node
    if isinstance(call.mark, Flat):
        return (reduce_flat(call.x, call.mark, op, node.axis, node.keepdims, mean),)
    return (reduce_tile(call.x, call.tile, op, node.axis, node.keepdims, mean),)


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
