"""Where a tile's split axes go through chainer's axis functions.

Functions that move, add or remove axes (``transpose``, ``reshape``,
``expand_dims``, ``squeeze``, ``stack``, reductions...) are exact on a tile
as long as they leave the split axes alone: consecutive, in order, their
extents unchanged. Each helper here returns the output's ``Tile`` mark, or
raises ``Refusal`` saying which split axis the function touches. Pure
functions of shapes and axis arguments, tested without MPI.
"""
from typing import Any, Iterable, List, Sequence, Tuple

import numpy as np

from .._marks import Flat, Tile
from ._call import GATHER, Refusal


def norm_axes(axis: Any, ndim: int) -> Tuple[int, ...]:
    """``axis`` (None, an int or a tuple) as sorted non-negative positions."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted(int(a) % ndim for a in items))


def touching(mark: Tile, ndim: int, axes: Iterable[int]) -> List[int]:
    """The split axes among ``axes`` (non-negative positions)."""
    split = mark.split_axes(ndim)
    return sorted(a for a in axes if a in split)


def placed(mark: Tile, out_ndim: int, positions: Sequence[int], what: str) -> Tile:
    """The mark of an output whose split axes landed at ``positions``."""
    if any(b != a + 1 for a, b in zip(positions, positions[1:])):
        raise Refusal(f"{what} separates the split axes (they land at {tuple(positions)})",
                      GATHER)
    return Tile(mark.grid, mark.extents, out_ndim - 1 - positions[-1])


def reduced(mark: Tile, ndim: int, axes: Sequence[int], keepdims: bool) -> Tile:
    """The mark after a reduction over ``axes`` (none of them split)."""
    if keepdims:
        return mark
    split = mark.split_axes(ndim)
    return placed(mark, ndim - len(axes), [p - sum(a < p for a in axes) for p in split],
                  "the reduction")


def permuted(mark: Tile, perm: Sequence[int], what: str) -> Tile:
    """The mark after a permutation of axes (``perm[i]``: the input axis at output i)."""
    split = mark.split_axes(len(perm))
    positions = [list(perm).index(a) for a in split]
    return placed(mark, len(perm), positions, what)


def permutation(fn: Any, ndim: int) -> Tuple[int, ...]:
    """The permutation ``fn`` (numpy's transpose, moveaxis...) makes of ``ndim`` axes."""
    probe = np.lib.stride_tricks.as_strided(np.zeros(1), shape=tuple(range(2, ndim + 2)),
                                            strides=(0,) * ndim)
    return tuple(int(n) - 2 for n in fn(probe).shape)


def inserted(mark: Tile, ndim: int, axis: int, what: str) -> Tile:
    """The mark after a new axis at ``axis`` (output coordinates)."""
    out = ndim + 1
    axis %= out
    positions = [p + (1 if axis <= p else 0) for p in mark.split_axes(ndim)]
    return placed(mark, out, positions, what)


def removed(mark: Tile, ndim: int, axes: Sequence[int], what: str) -> Tile:
    """The mark after ``axes`` (size 1, none split) are dropped."""
    hit = touching(mark, ndim, axes)
    if hit:
        raise Refusal(f"{what} drops split axis {hit[0]}", GATHER)
    return reduced(mark, ndim, axes, False)


def reshaped(mark: Tile, shape: Tuple[int, ...], target: Sequence[int]) -> Any:
    """The mark of a reshape of a tile of local ``shape`` to ``target`` (-1 allowed).

    Exact where the split axes and all that follows them stay as they are
    (only the leading axes change), and ``(N, -1)`` makes a ``Flat``.
    """
    out = resolve(shape, target)
    keep = mark.tail + len(mark.extents)
    ndim = len(shape)
    if len(out) >= keep and tuple(out[len(out) - keep:]) == tuple(shape[ndim - keep:]):
        return Tile(mark.grid, mark.extents, mark.tail)
    g = len(mark.extents)
    if mark.lead(ndim) == 0 and tuple(out[:g]) == tuple(shape[:g]):  # split axes lead
        return Tile(mark.grid, mark.extents, len(out) - g)
    if len(out) == 2 and out[0] == shape[0] and mark.lead(ndim) >= 1:
        block = mark.global_shape(tuple(shape))[1:]
        return Flat(mark.grid, tuple(block), mark.lead(ndim) - 1)
    raise Refusal(f"it reshapes a tile of shape {tuple(shape)} to {tuple(out)}, mixing the split "
                  "axes with others", "for a fully connected layer use mnpar.spatial.Linear "
                  "(convert makes chainer's Linear one); else " + GATHER)


def resolve(shape: Sequence[int], target: Sequence[int]) -> Tuple[int, ...]:
    """``target`` with its -1 worked out for an array of ``shape``."""
    target = tuple(int(t) for t in (target if isinstance(target, (tuple, list)) else (target,)))
    if -1 in target:
        known = int(np.prod([t for t in target if t != -1]))
        size = int(np.prod(shape))
        target = tuple(size // max(known, 1) if t == -1 else t for t in target)
    return target


def concat_axis(mark: Tile, ndim: int, axis: int, what: str) -> Tile:
    """The mark of a concatenation (or split) along ``axis``: not a split axis."""
    axis %= ndim
    if axis in mark.split_axes(ndim):
        raise Refusal(f"{what} along split axis {axis}, on tiles rather than images", GATHER)
    return mark
