"""What the guard knows about an array: split over the tensor group, and how.

While a parallelized model runs, every activation that a rank holds only a
part of is *marked* with a ``Shard``: the axis that is cut, the whole
extent of the cut, and every rank's bounds along it (so every rank decides
alike what a function may do with it, and refuses alike). An axis may hold
``pre`` blocks of the cut one after another, as a reshape that merges a
leading axis into the cut one leaves it::

    (B, T, D) cut along T (bounds over T)           axis 1, pre 1
    reshaped to (B * T, D)                          axis 0, pre B: B blocks of T rows,
                                                    of which this rank holds its rows
    (B, T, H * Dh) cut by heads, reshaped to        axis 2, bounds over H
    (B, T, H, Dh)

Unmarked arrays are whole: the same on every rank of the group. Marks live
in a registry keyed by the array (a weak reference: a mark dies with its
array) and only while a parallelized forward runs.
"""
import functools
import threading
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import chainer


class Shard(NamedTuple):
    """This rank's part: ``axis`` holds ``pre`` blocks of ``bounds[rank]:bounds[rank + 1]``
    of a cut of ``total``; ``bounds`` has one entry per rank of ``comm``, and one more."""

    comm: Any
    axis: int
    total: int
    bounds: Tuple[int, ...]
    pre: int = 1

    @property
    def start(self) -> int:
        return self.bounds[self.comm.rank]

    @property
    def stop(self) -> int:
        return self.bounds[self.comm.rank + 1]

    def extent(self, rank: Optional[int] = None) -> int:
        """The local extent of ``axis`` on ``rank`` (this rank by default)."""
        r = self.comm.rank if rank is None else rank
        return self.pre * (self.bounds[r + 1] - self.bounds[r])

    def whole_shape(self, shape: Tuple[int, ...]) -> Tuple[int, ...]:
        """The whole array's shape, for this rank's part of local ``shape``."""
        return shape[:self.axis] + (self.pre * self.total,) + shape[self.axis + 1:]

    def at(self, axis: int) -> "Shard":
        return self._replace(axis=axis)

    def describe(self) -> str:
        blocks = f" ({self.pre} blocks of it)" if self.pre > 1 else ""
        return f"a part of axis {self.axis} (cut {self.bounds}){blocks}"


class _State(threading.local):
    def __init__(self) -> None:
        self.scopes: List[Any] = []
        self.depth = 0
        self.marks: Dict[int, Tuple[Callable[[], Any], Shard]] = {}
        self.copies: Dict[Tuple[Any, ...], Tuple[Any, Any]] = {}


state = _State()


def array_of(x: Any) -> Any:
    return x.array if isinstance(x, chainer.Variable) else x


def mark_of(x: Any) -> Optional[Shard]:
    """The mark of ``x`` (a Variable or an array), or None: whole on every rank."""
    a = array_of(x)
    if a is None or not state.scopes:
        return None
    entry = state.marks.get(id(a))
    if entry is None or entry[0]() is not a:
        return None
    return entry[1]


def mark(x: Any, m: Optional[Shard]) -> Any:
    """Marks ``x`` while a parallelized forward runs; returns ``x``."""
    a = array_of(x)
    if a is None or not state.scopes:
        return x
    key = id(a)
    if m is None:
        state.marks.pop(key, None)
        return x
    marks = state.marks

    def forget(r: Any) -> None:
        entry = marks.get(key)
        if entry is not None and entry[0] is r:
            del marks[key]

    ref: Callable[[], Any]
    try:
        ref = weakref.ref(a, forget)
    except TypeError:  # an array type without weak references: kept until the forward ends
        ref = functools.partial(_same, a)
    marks[key] = (ref, m)
    return x


def _same(a: Any) -> Any:
    return a


class trusted:
    """Within it, chainer functions run unguarded: tensor-parallel code that does its own
    collectives and marks."""

    def __enter__(self) -> None:
        state.depth += 1

    def __exit__(self, *exc: Any) -> None:
        state.depth -= 1
