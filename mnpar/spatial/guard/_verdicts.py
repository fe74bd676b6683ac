"""The verdicts of ``_rules``' table: how each kind of chainer function meets tiles.

Each takes the call (``_call.Call``: the function node, its inputs and their
marks) and returns the marks of its outputs, a spatial version to run
instead, or a ``Refusal``.
"""
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from .._marks import Flat, Mark, Tile
from ._call import GATHER, Call, Refusal, Verdict
from ._layout import (
    concat_axis,
    inserted,
    norm_axes,
    permutation,
    permuted,
    reduced,
    removed,
    reshaped,
    resolve,
    touching,
)


def _same(call: Call) -> List[Optional[Mark]]:
    return [call.mark]


def _all_outputs(mark: Optional[Mark]) -> Callable[[Sequence[Any]], List[Optional[Mark]]]:
    return lambda outputs: [mark] * len(outputs)


def pointwise(call: Call) -> Verdict:
    """Elementwise with numpy broadcasting: the split axes of every input line up."""
    m = call.mark
    if isinstance(m, Flat):
        offsets, local = [1], (int(np.prod(m.local_block())),)
    else:
        offsets, local = [call.ndim - p for p in m.split_axes(call.ndim)], m.local()
    for i, (x, shape, mark) in enumerate(zip(call.inputs, call.shapes, call.marks)):
        if isinstance(mark, (Tile, Flat)):
            continue
        for offset, n in zip(offsets, local):
            e = shape[len(shape) - offset] if len(shape) >= offset else 1
            if e == 1:
                continue
            if e != n:
                raise Refusal(f"its input {i} (shape {shape}) is not a tile, and varies along "
                              f"a split axis ({e} entries; this rank's tile has {n})",
                              "make it with grid.tile(whole) or, for a per-channel value, "
                              "shape it (1, C, 1, 1)")
            if getattr(x, "requires_grad", False):
                raise Refusal(f"its input {i} (shape {shape}) has the tile's shape and a "
                              "gradient, but it is not a tile (made by F.tile, F.repeat or "
                              "F.concat from parameters?)",
                              "broadcast the parameter with F.broadcast_to from shape "
                              "(1, C, 1, 1) instead")
    return Verdict(_all_outputs(m))


def channel_params(call: Call) -> Verdict:
    """The tile first, parameters laid along axes 1, 2...: none may reach a split axis."""
    tile = call.tile
    split = tile.split_axes(call.ndim)
    for i, shape in enumerate(call.shapes[1:], 1):
        if call.marks[i] is None and any(1 <= a <= len(shape) for a in split):
            raise Refusal(f"its parameter {i} (shape {shape}) has an entry per pixel", GATHER)
    return Verdict(_all_outputs(tile))


def fixed_batch_norm(call: Call) -> Verdict:
    tile = call.tile
    gamma_ndim = len(call.shapes[1])
    axis = call.node.axis
    key = tuple(axis) if axis is not None else (0,) + tuple(range(gamma_ndim + 1, call.ndim))
    if touching(tile, call.ndim, [a for a in range(call.ndim) if a not in key]):
        raise Refusal(f"its statistics have an entry per pixel (axis={axis!r})", GATHER)
    return Verdict(_all_outputs(tile))


def tile_inputs_only(call: Call) -> None:
    """Inputs that are not tiles but have a gradient would be summed over the grid with
    every rank's own shape: refused (constants are fine)."""
    for i, (x, m) in enumerate(zip(call.inputs, call.marks)):
        if not isinstance(m, (Tile, Flat)) and getattr(x, "requires_grad", False):
            raise Refusal(f"its input {i} (shape {call.shapes[i]}) is not a tile and has a "
                          "gradient", "make it a tile (computed from the tiles, or "
                          "F.broadcast_to of a (1, C, 1, 1) value)")


def along(attr: str, default: Optional[int] = None) -> Callable[[Call], Verdict]:
    """Exact unless the node's axis or axes (attribute ``attr``) include a split axis."""
    def rule(call: Call) -> Verdict:
        axis = getattr(call.node, attr, default) if attr else default
        if axis is None:
            raise Refusal("it works on the flattened array", GATHER)
        if isinstance(call.mark, Flat):
            raise Refusal(f"it receives {call.mark.describe()}", GATHER)
        for a in (axis if isinstance(axis, (tuple, list)) else (axis,)):
            concat_axis(call.tile, call.ndim, int(a), "it works")
        tile_inputs_only(call)
        return Verdict(_all_outputs(call.tile))
    return rule


def stacked(attr: str, axis_of: Callable[[int], int]) -> Callable[[Call], Verdict]:
    def rule(call: Call) -> Verdict:
        tile_inputs_only(call)
        return Verdict(_all_outputs(concat_axis(call.tile, call.ndim, axis_of(call.ndim),
                                                 "it joins")))
    return rule


def reduction(convert: Optional[Callable[[Call], Any]] = None,
              keep: Callable[[Any], bool] = lambda node: bool(getattr(node, "keepdims", False)),
              axes_of: Callable[[Call], Any] = lambda call: call.node.axis,
              fix: str = GATHER) -> Callable[[Call], Verdict]:
    """Exact over axes that are not split; over split axes converted (or refused)."""
    def rule(call: Call) -> Verdict:
        if isinstance(call.mark, Flat) and convert is not None:
            return Verdict(convert=lambda: convert(call))
        axes = norm_axes(axes_of(call), call.ndim)
        tile = call.tile
        if touching(tile, call.ndim, axes):
            if convert is None:
                raise Refusal(f"it reduces over the split axes {touching(tile, call.ndim, axes)}",
                              fix)
            return Verdict(convert=lambda: convert(call))
        return Verdict(_all_outputs(reduced(tile, call.ndim, axes, keep(call.node))))
    return rule


def sum_to(call: Call) -> Verdict:
    shape = tuple(call.node._shape)
    lead = call.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and call.shapes[0][lead + i] != 1)
    if touching(call.tile, call.ndim, axes):
        raise Refusal("it sums over a split axis", GATHER)
    keep = call.tile
    return Verdict(_all_outputs(reduced(keep, call.ndim, tuple(range(lead)), False)))


def transpose(call: Call) -> Verdict:
    axes = call.node.axes
    perm = (tuple(reversed(range(call.ndim))) if axes is None
            else tuple(int(a) % call.ndim for a in axes))
    return Verdict(_all_outputs(permuted(call.tile, perm, "the transpose")))


def moved(fn: Callable[[Any, Any], Any]) -> Callable[[Call], Verdict]:
    def rule(call: Call) -> Verdict:
        perm = permutation(lambda a: fn(call.node, a), call.ndim)
        return Verdict(_all_outputs(permuted(call.tile, perm, "it")))
    return rule


def reshape(call: Call) -> Verdict:
    m = call.mark
    if isinstance(m, Flat):
        if resolve(call.shapes[0], call.node.shape) == call.shapes[0]:
            return Verdict(_all_outputs(m))
        raise Refusal(f"it reshapes {m.describe()}", GATHER)
    return Verdict(_all_outputs(reshaped(m, call.shapes[0], call.node.shape)))


def expand_dims(call: Call) -> Verdict:
    return Verdict(_all_outputs(inserted(call.tile, call.ndim, call.node.axis, "the new axis")))


def squeeze(call: Call) -> Verdict:
    if call.node.axis is None:
        raise Refusal("it squeezes every axis of extent 1, and a tile's extents are not the "
                      "image's", "name the axis: F.squeeze(h, axis=...)")
    axes = norm_axes(call.node.axis, call.ndim)
    return Verdict(_all_outputs(removed(call.tile, call.ndim, axes, "it")))


def stack(call: Call) -> Verdict:
    tile_inputs_only(call)
    return Verdict(_all_outputs(inserted(call.tile, call.ndim, call.node.axis, "the stack")))


def separate(call: Call) -> Verdict:
    axes = norm_axes(call.node.axis, call.ndim)
    return Verdict(_all_outputs(removed(call.tile, call.ndim, axes, "separate")))


def broadcast_to(call: Call) -> Verdict:
    shape = tuple(call.node._shape)
    tile = call.tile
    positions = [p + len(shape) - call.ndim for p in tile.split_axes(call.ndim)]
    if [shape[p] for p in positions] != list(tile.local()):
        raise Refusal(f"it broadcasts a tile to {shape}", GATHER)
    return Verdict(_all_outputs(tile))


def tile_reps(call: Call) -> Verdict:
    reps = call.node.reps
    reps = (1,) * (call.ndim - len(reps)) + tuple(reps)
    if any(reps[p] != 1 for p in call.tile.split_axes(call.ndim)):
        raise Refusal("it repeats a tile along a split axis", GATHER)
    return Verdict(_all_outputs(call.tile))


def when(attr: str, ok: Sequence[Any], then: Callable[[Call], Verdict],
         fix: str = GATHER) -> Callable[[Call], Verdict]:
    """``then``'s rule where the node's ``attr`` is one of ``ok``; else refused."""
    def rule(call: Call) -> Verdict:
        value = getattr(call.node, attr, None)
        if value not in ok:
            raise Refusal(f"it reduces over the whole array ({attr}={value!r})", fix)
        return then(call)
    return rule


def class_axis(call: Call) -> Verdict:
    """A loss per pixel over axis 1 (``reduce='no'``): the class axis goes."""
    return Verdict(_all_outputs(reduced(call.tile, call.ndim, (1,), False)))


def huber(call: Call) -> Verdict:
    """``reduce='no'``: pointwise; ``'sum_along_second_axis'``: a sum over axis 1."""
    if call.node.reduce == "sum_along_second_axis":
        pointwise(call)
        return class_axis(call)
    return when("reduce", ("no",), pointwise, LOSS_FIX)(call)


def refuse(why: str, fix: str) -> Callable[[Call], Verdict]:
    def rule(call: Call) -> Verdict:
        raise Refusal(why, fix)
    return rule


LOSS_FIX = ("compute the loss outside the converted model on its output tiles "
            "(mnpar.spatial.mean_squared_error, or mnpar.spatial.sum_over_grid of F.sum), "
            "use reduce='no' and F.mean (converted), or " + GATHER)
