"""Where the array a random function draws for sits in the whole array one process holds.

A draw's numbers are a function of each element's index in the *whole*
array, so every split must say where its piece sits. Each split says it
once, in one of three ways, and they compose::

    split                 says                                       axes
    pipeline micro-batch  batch_share(before, count, total) context  0 (the batch)
    data parallelism      scope(..., data=comm): replica r of n      0 (the batch)
    spatial tiles         a provider that reads the tile's mark      the image axes
    tensor shards         sharded(axis, start, total) context        the sharded axis

A ``Position`` is the whole array's shape and, per axis, the whole-array
indices of the local rows along it; the element numbers (C order in the
whole array) follow. Axis 0 of a draw is the batch where the function's row
in ``_draws`` says so: rows per example are the array's rows over the
micro-batch's examples (a ``(B * T, D)`` reshape keeps T rows an example),
and a count that does not divide them is refused rather than guessed.
"""
import contextlib
import threading
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np


class Position(NamedTuple):
    """The whole array's ``shape``, and per axis the whole-array indices of the local rows."""

    shape: Tuple[int, ...]
    rows: Tuple[np.ndarray, ...]

    def runs(self) -> Tuple[np.ndarray, int]:
        """The number of the first element of each run of consecutive elements, and the
        runs' length.

        A run is the trailing axes the local array holds whole, with the axis
        before them when its local rows are consecutive: the whole array for a
        batch slice, a row of the last axis for a 2-D tile, one element where
        the last axis is scattered (a flattened tile).
        """
        nd = len(self.shape)
        k = nd
        while k and self.rows[k - 1].size == self.shape[k - 1]:
            k -= 1  # whole axes (their rows are 0 .. n - 1: they are sorted slices)
        if k and _consecutive(self.rows[k - 1]):
            k -= 1
        if k == nd:  # the last axis is scattered
            return self._numbers(self.rows), 1
        length = int(np.prod([r.size for r in self.rows[k:]], dtype=np.int64))
        return self._numbers(self.rows[:k + 1])[..., 0], length

    def _numbers(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        """The element numbers of the rows of the first ``len(rows)`` axes (the others at 0)."""
        number = np.zeros((1,) * len(rows), np.uint64)
        for a, index in enumerate(rows):
            stride = np.uint64(int(np.prod(self.shape[a + 1:], dtype=np.int64)))
            shape = [1] * len(rows)
            shape[a] = index.size
            number = number + index.astype(np.uint64).reshape(shape) * stride
        return number


def _consecutive(index: np.ndarray) -> bool:
    return index.size > 0 and bool(np.all(np.diff(index) == 1))


def whole(shape: Sequence[int]) -> Position:
    """The position of an array that is the whole array."""
    shape = tuple(int(n) for n in shape)
    return Position(shape, tuple(np.arange(n, dtype=np.int64) for n in shape))


def with_axis(position: Position, axis: int, start: Any, total: int) -> Position:
    """``position`` with ``axis`` a slice at ``start`` (or explicit indices) of ``total`` rows."""
    rows = list(position.rows)
    n = rows[axis].size
    rows[axis] = (np.asarray(start, np.int64) if np.ndim(start)
                  else np.arange(int(start), int(start) + n, dtype=np.int64))
    shape = list(position.shape)
    shape[axis] = int(total)
    return Position(tuple(shape), tuple(rows))


class Share(NamedTuple):
    """This micro-batch is examples ``before .. before + examples`` of ``total``."""

    before: int
    examples: int
    total: int


class Sharded(NamedTuple):
    """Axis ``axis`` of a draw holds rows ``start .. start + n`` of ``total``."""

    axis: int
    start: int
    total: int


# A provider gives the position of an array it knows (a spatial tile: all of its axes) or None.
Provider = Callable[[Any, Position], Optional[Position]]


class _State(threading.local):
    def __init__(self) -> None:
        self.shares: List[Share] = []
        self.sharded: List[Sharded] = []


state = _State()
providers: List[Provider] = []


@contextlib.contextmanager
def batch_share(before: int, count: int, total: int) -> Iterator[None]:
    """Within it, axis 0 of a draw is examples ``before .. before + count`` of ``total``."""
    state.shares.append(Share(int(before), int(count), int(total)))
    try:
        yield
    finally:
        state.shares.pop()


@contextlib.contextmanager
def sharded(axis: int, start: int, total: int) -> Iterator[None]:
    """Within it, axis ``axis`` of a draw's array is the slice at ``start`` of ``total`` rows.

    For split code (tensor shards, sequence parallelism): a random function
    called inside draws this slice of the whole array's numbers.
    """
    if int(start) < 0 or int(total) < 1:
        raise ValueError(f"sharded(axis={axis}, start={start}, total={total}): start must be "
                         "0 or more and total at least 1")
    state.sharded.append(Sharded(int(axis), int(start), int(total)))
    try:
        yield
    finally:
        state.sharded.pop()


def batch_rows(rows: int, what: str) -> Tuple[int, int, int]:
    """Axis 0 of ``rows`` rows under the innermost share: (offset, rows of the whole batch,
    rows an example); without a share, the array is this rank's whole batch."""
    if not state.shares:
        return 0, rows, 0
    share = state.shares[-1]
    if share.examples < 1 or rows % share.examples:
        raise ValueError(
            f"mnpar.random: {what} draws for an array of {rows} rows in a micro-batch of "
            f"{share.examples} examples; its axis 0 must hold a whole number of rows per "
            "example (the batch axis first), so the draw can be the whole batch's slice")
    per = rows // share.examples
    return per * share.before, per * share.total, per


def locate(shape: Tuple[int, ...], like: Any, batch: bool, what: str,
           replicas: Optional[Tuple[int, int]] = None) -> Position:
    """The position of a draw of ``shape`` (named ``what``) in the whole array.

    Args:
        shape: the draw's shape.
        like: the array the draw is for (providers read its position), or None.
        batch: axis 0 is the batch.
        what: the draw, for errors.
        replicas: (this replica, replicas) of data parallelism, if any.
    """
    position = whole(shape)
    placed = False  # a provider placed the array (a tile: its batch axis too)
    if like is not None:
        for provide in providers:
            known = provide(like, position)
            if known is not None:
                position, placed = known, True
                break
    for s in state.sharded:
        axis = s.axis + len(shape) if s.axis < 0 else s.axis
        if not 0 <= axis < len(shape):
            raise ValueError(f"mnpar.random: {what} draws for an array of shape {shape} "
                             f"inside sharded(axis={s.axis}), which it does not have")
        if s.start + shape[axis] > s.total:
            raise ValueError(f"mnpar.random: {what}: rows {s.start} to "
                             f"{s.start + shape[axis]} of axis {s.axis} are past its whole "
                             f"length {s.total}")
        position = with_axis(position, axis, s.start, s.total)
    if batch and shape and not placed:
        offset, total, _ = batch_rows(int(shape[0]), what)
        if replicas is not None:
            offset, total = replicas[0] * total + offset, replicas[1] * total
        if total != position.shape[0]:
            position = with_axis(position, 0, offset, total)
    return position
