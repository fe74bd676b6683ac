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
array) and only while a parallelized forward runs; the registry's code is
in ``mnpar._marks``, which spatial parallelism's marks share.
"""
from typing import Any, Dict, NamedTuple, Optional, Tuple

from .._marks import Marks, Scope
from .._marks import array_of as array_of


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


class _State(Marks[Scope, Shard]):
    """The tensor guard's per-forward state (``mnpar._marks``), one per thread, and
    ``copies``: the gathers and copies made once per forward (``_guard._once``)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: Dict[Tuple[Any, ...], Tuple[Any, Any]] = {}


state = _State()
# The state's methods by the package's names: mark_of(x) (None: whole on every rank),
# mark(x, m) while a parallelized forward runs, and trusted(), within which chainer's
# functions run unguarded (tensor-parallel code that does its own collectives and marks).
mark_of = state.mark_of
mark = state.mark
trusted = state.trusted
