"""Where a parameter is cut over the tensor group: the axis and every rank's bounds."""
from typing import Any, NamedTuple, Optional, Tuple

from ..functions import _group_ops as ops


class Cut(NamedTuple):
    """A parameter cut along ``axis``: rank r holds ``bounds[r]:bounds[r + 1]``."""

    comm: Any
    axis: int
    bounds: Tuple[int, ...]

    def part(self, whole: Any) -> Any:
        return ops.part(whole, self.axis, self.bounds, self.comm.rank)

    def whole(self, local: Any, what: str) -> Any:
        return ops.gather(self.comm, local, self.axis, what)[0]

    def shape(self, whole: Tuple[int, ...]) -> Tuple[int, ...]:
        r = self.comm.rank
        return whole[:self.axis] + (self.bounds[r + 1] - self.bounds[r],) + whole[self.axis + 1:]

    def __deepcopy__(self, memo: dict) -> "Cut":
        return self  # holds a communicator: copies of a model share it


def cut_of(param: Any) -> Optional[Cut]:
    """The cut of a parameter (or array holder) split over the tensor group, or None."""
    return getattr(param, "_mnpar_cut", None)
