"""A function node the guard is about to run on tiles, and what it decides.

``Call`` gathers what every rule needs (the node, its inputs, their marks and
shapes, the first tile); a rule answers with a ``Verdict`` or raises a
``Refusal``, which the guard turns into a ``SpatialError`` naming the layer.
"""
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Set

from .._marks import Flat, Mark, Tile, array_of

GATHER = "call mnpar.spatial.gather(h, grid) first, so the function sees the whole image"


class Refusal(Exception):
    """A function cannot run on this tile: ``why``, and ``fix`` (what to call instead)."""

    def __init__(self, why: str, fix: Optional[str] = None) -> None:
        super().__init__(why)
        self.why = why
        self.fix = fix


class Verdict(NamedTuple):
    """What the guard does with a node: ``marks`` for its outputs, or ``convert`` it."""

    marks: Optional[Callable[[Sequence[Any]], List[Optional[Mark]]]] = None
    convert: Optional[Callable[[], Any]] = None


class Call:
    """A node about to run, its inputs and their marks.

    Raises:
        Refusal: tiles of different images (or a tile and a flattened tile) meet.
    """

    def __init__(self, node: Any, inputs: Sequence[Any], marks: Sequence[Optional[Mark]]):
        self.node = node
        self.inputs = list(inputs)
        self.marks = list(marks)
        self.shapes = [tuple(array_of(x).shape) for x in inputs]
        tiles = [i for i, m in enumerate(marks) if isinstance(m, (Tile, Flat))]
        concrete = [i for i in tiles if not getattr(marks[i], "spread", False)]
        self.first = (concrete or tiles)[0]
        first: Any = marks[self.first]
        self.mark = first
        self.grid = first.grid
        self.ndim = len(self.shapes[self.first])
        kinds: Set[Any] = {marks[i] for i in concrete}
        if len(kinds) > 1:
            a, b = sorted(kinds, key=repr)[:2]
            raise Refusal(f"tiles of different images meet in it: {a.describe()} and "
                          f"{b.describe()}", "give it tiles of one image (check the sizes "
                          "and strides of the layers before it)")

    @property
    def tile(self) -> Tile:
        """The tile mark (a flattened tile is refused here)."""
        if not isinstance(self.mark, Tile):
            raise Refusal(f"it receives {self.mark.describe()}", GATHER)
        return self.mark

    @property
    def x(self) -> Any:
        """The first tile input."""
        return self.inputs[self.first]
