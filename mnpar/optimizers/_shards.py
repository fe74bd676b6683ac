"""Which elements of each parameter a rank owns: balanced flat shards.

A group of parameters (in stages 1 and 2 every parameter of one dtype, in
stage 3 one link's) is laid end to end, sorted by name, in one flat buffer
of ``T`` elements; rank ``r`` of ``N`` owns the elements ``[lo_r, hi_r)``,
the first ``T % N`` ranks one more than the others::

    T = 10, N = 4:   rank 0 [0, 3)   rank 1 [3, 6)   rank 2 [6, 8)   rank 3 [8, 10)

No rank holds more than ``ceil(T / N)`` elements, whatever ``N`` and the
parameters' sizes, so every rank's share of a group is within one element
of ``T / N``. A rank's shard of one parameter is the part of its range that
falls inside that parameter, possibly empty.

Collectives move a group in *columns* (``columns``): column ``j`` holds the
elements ``[lo_r + j c, lo_r + (j + 1) c)`` of every rank's range, so in one
column each rank sends or receives at most ``c`` elements (equal counts,
as NCCL needs) and a column's buffer is bounded whatever the model's size::

    N = 2, T = 10, c = 2:   rank 0 owns [0, 5), rank 1 [5, 10)
    column 0: [0, 2) [5, 7)    column 1: [2, 4) [7, 9)    column 2: [4, 5) [9, 10)

``copy_flat`` packs a flat range of a group's arrays (gradients, one per
parameter) into a buffer: what every collective sends.
"""
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .._arrays import get_array_module

Range = Tuple[int, int]
COLUMN_BYTES = 1 << 20  # bytes of one rank's part of a column


def balanced(total: int, n: int) -> List[Range]:
    """``[lo_r, hi_r)`` of every rank ``r`` of ``n`` over ``total`` elements."""
    if n < 1 or total < 0:
        raise ValueError(f"balanced({total}, {n}): needs total >= 0 and n >= 1")
    base, extra = divmod(total, n)
    bounds, lo = [], 0
    for r in range(n):
        hi = lo + base + (1 if r < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


class Slot(NamedTuple):
    """One parameter in a group's flat buffer: its name, first element, size and shape."""

    name: str
    offset: int
    size: int
    shape: Tuple[int, ...]


class Piece(NamedTuple):
    """Elements ``[start, stop)`` of the flattened parameter ``slot`` (an index into
    the group's slots), found at ``flat`` in the group's buffer."""

    slot: int
    start: int
    stop: int
    flat: int

    @property
    def size(self) -> int:
        return self.stop - self.start


class FlatLayout:
    """A group of parameters end to end, and each rank's range of it.

    Args:
        names: the parameters' names, in the order they are laid out.
        shapes: their shapes.
        n: the number of ranks the group is sharded over.
    """

    def __init__(self, names: Sequence[str], shapes: Sequence[Tuple[int, ...]], n: int) -> None:
        self.slots: List[Slot] = []
        offset = 0
        for name, shape in zip(names, shapes):
            size = 1
            for d in shape:
                size *= int(d)
            self.slots.append(Slot(name, offset, size, tuple(int(d) for d in shape)))
            offset += size
        self.total = offset
        self.n = n
        self.bounds = balanced(offset, n)

    def shard_size(self, rank: int) -> int:
        lo, hi = self.bounds[rank]
        return hi - lo

    @property
    def largest_shard(self) -> int:
        return self.shard_size(0)

    def pieces(self, lo: int, hi: int) -> List[Piece]:
        """The parts of the flat range ``[lo, hi)`` in each parameter, one per slot (empty
        where the range misses the slot), in slot order."""
        out = []
        for i, s in enumerate(self.slots):
            a, b = max(lo, s.offset), min(hi, s.offset + s.size)
            if b < a:
                a = b = min(max(lo, s.offset), s.offset + s.size)
            out.append(Piece(i, a - s.offset, b - s.offset, a))
        return out

    def shard(self, rank: int) -> List[Piece]:
        """Rank ``rank``'s piece of every parameter (some empty), in slot order."""
        return self.pieces(*self.bounds[rank])

    def columns(self, width: int) -> List[List[Range]]:
        """For each column, every rank's flat range in it (``width`` elements at most)."""
        if width < 1:
            raise ValueError(f"column width {width} must be at least 1")
        count = max(1, -(-self.largest_shard // width))
        return [[(min(lo + j * width, hi), min(lo + (j + 1) * width, hi))
                 for lo, hi in self.bounds] for j in range(count)]


def reduce_dtype(dtype: Any) -> np.dtype:
    """The dtype a group of ``dtype`` is summed in: float16 in float32, as the strategies."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def column_width(dtype: Any) -> int:
    """Elements of ``dtype`` in one rank's part of a column (``COLUMN_BYTES``)."""
    return max(1, COLUMN_BYTES // np.dtype(dtype).itemsize)


def copy_flat(arrays: Sequence[Optional[Any]], layout: FlatLayout, lo: int, hi: int,
              out: Any, scale: float = 1.0) -> None:
    """Writes elements ``[lo, hi)`` of the group (``arrays``: one per slot, None for zeros)
    times ``scale`` into ``out``, casting to its dtype."""
    xp = get_array_module(out)
    for piece in layout.pieces(lo, hi):
        if piece.size == 0:
            continue
        dst = out[piece.flat - lo: piece.flat - lo + piece.size]
        src = arrays[piece.slot]
        if src is None:
            dst[...] = 0
            continue
        part = src.reshape(-1)[piece.start: piece.stop]
        if scale == 1.0:
            dst[...] = part
        elif xp is np:
            np.multiply(part, scale, out=dst, casting="unsafe")
        else:  # in the buffer's dtype (float16 gradients are summed in float32)
            dst[...] = part
            dst *= scale
