"""Where a cut axis goes through chainer's axis functions (reshape, transpose...).

A reshape keeps a part a part when the elements this rank holds are, in the
new shape, again a cut along one axis (``fit``): every rank then holds the
same elements it held before, so the reshape is exact. A reshape's target
is read as one process's shape first (the shape the model's code would
name in one process: ``(B, T, heads, -1)``), and as this rank's own shape
where that does not fit (a shape the code computed from this rank's
``h.shape``). Pure functions of shapes, tested without MPI.
"""
import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ._errors import GATHER, Refusal
from ._marks import Shard

Shape = Tuple[int, ...]


def resolve(target: Sequence[int], size: int) -> Optional[Shape]:
    """``target`` with its ``-1`` made what fills ``size`` elements; None if it cannot."""
    shape = tuple(int(n) for n in target)
    free = [i for i, n in enumerate(shape) if n == -1]
    if len(free) > 1 or any(n < -1 for n in shape):
        return None
    known = math.prod(n for n in shape if n != -1)
    if free:
        if known == 0 or size % known:
            return None
        shape = shape[:free[0]] + (size // known,) + shape[free[0] + 1:]
    return shape if math.prod(shape) == size else None


def _blocks(m: Shard, whole: Shape) -> Tuple[int, int]:
    """(O, I): the cut's blocks before it and the elements after it, in the whole array."""
    return math.prod(whole[:m.axis]) * m.pre, math.prod(whole[m.axis + 1:])


def fit(m: Shard, whole_in: Shape, whole_out: Shape) -> Optional[Shard]:
    """The mark of the whole array ``whole_in`` reshaped to ``whole_out``, where this
    rank's elements are a cut of one axis there; None where they are not.

    Where several axes would do (a rank that holds whole blocks, at degree 1),
    the one with the fewest blocks (``pre``) is the cut.
    """
    outer, inner = _blocks(m, whole_in)
    span = m.total * inner
    found: List[Shard] = []
    for k, n in enumerate(whole_out):
        before, after = math.prod(whole_out[:k]), math.prod(whole_out[k + 1:])
        if not before or not after or outer % before or span % after:
            continue
        pre, total = outer // before, span // after
        if n != pre * total or any(b * inner % after for b in m.bounds):
            continue
        found.append(m._replace(axis=k, total=total, pre=pre,
                                bounds=tuple(b * inner // after for b in m.bounds)))
    return min(found, key=lambda s: (s.pre, -s.total)) if found else None


def local_shape(m: Shard, whole: Shape) -> Shape:
    return whole[:m.axis] + (m.extent(),) + whole[m.axis + 1:]


def reshaped(m: Shard, local_in: Shape, target: Sequence[int]) -> Tuple[Shape, Shard]:
    """This rank's target shape and the output's mark for ``reshape(x, target)``.

    Raises:
        Refusal: neither reading of ``target`` keeps the parts a cut of one axis.
    """
    whole_in = m.whole_shape(tuple(local_in))
    whole = resolve(target, math.prod(whole_in))
    if whole is not None:
        out = fit(m, whole_in, whole)
        if out is not None:
            return local_shape(out, whole), out
    mine = resolve(target, math.prod(local_in))
    if mine is not None:
        for k in range(len(mine)):
            guess = resolve(mine[:k] + (-1,) + mine[k + 1:], math.prod(whole_in))
            out = fit(m, whole_in, guess) if guess is not None else None
            if guess is not None and out is not None and out.axis == k and \
                    local_shape(out, guess) == mine:
                return mine, out
    raise Refusal(f"its target shape {tuple(target)} does not keep this rank's part of "
                  f"{describe(m, whole_in)} a cut of one axis, read as one process's shape "
                  "or as this rank's", "reshape so that the cut axis stays whole or splits "
                  "into whole units (heads), or " + GATHER)


def describe(m: Shard, whole: Shape) -> str:
    return f"the whole {whole} cut along axis {m.axis} at {m.bounds}"


def permuted(m: Shard, perm: Sequence[int]) -> Shard:
    """The mark after a permutation of axes (``perm[i]``: the input axis at output i)."""
    return m.at(list(perm).index(m.axis))


def permutation(fn: Any, ndim: int) -> Tuple[int, ...]:
    """The permutation ``fn`` (numpy's transpose, moveaxis...) makes of ``ndim`` axes."""
    probe = np.lib.stride_tricks.as_strided(np.zeros(1), shape=tuple(range(2, ndim + 2)),
                                            strides=(0,) * ndim)
    return tuple(int(n) - 2 for n in fn(probe).shape)


def norm_axes(axis: Any, ndim: int) -> Tuple[int, ...]:
    """``axis`` (None, an int or a tuple) as sorted non-negative positions."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted(int(a) % ndim for a in items))


def removed(m: Shard, ndim: int, axes: Sequence[int], what: str) -> Shard:
    """The mark after ``axes`` (not the cut one) are removed."""
    if m.axis in axes:
        raise Refusal(f"{what} removes the cut axis {m.axis}", GATHER)
    return m.at(m.axis - sum(a < m.axis for a in axes))


def inserted(m: Shard, ndim: int, axis: int) -> Shard:
    """The mark after a new axis at ``axis`` of the ``ndim + 1`` output axes."""
    a = axis % (ndim + 1)
    return m.at(m.axis + (a <= m.axis))
