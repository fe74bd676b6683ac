"""What the guard knows about an array (a tile, a flattened tile, the whole image), and
the per-forward state that holds it.

While a converted model runs, every array that holds a tile is *marked*:
the mark says which grid cut it, the global extents of the split axes and
where they sit. A tile's split axes are ``grid.ndim`` consecutive axes
followed by ``tail`` free axes (unsplit spatial axes, whole on every rank)::

    (N, C, H, W) on a (2, 2) grid     split axes 2, 3    tail 0
    (N, C, H, W) on a (2,) grid       split axis 2       tail 1 (W is whole)
    (N, H, W) after a loss per pixel  split axes 1, 2    tail 0

Tile extents do not tell the image's (10 rows over 3 ranks and 11 rows give
rank 0 the same 4), so the mark keeps the global extents, found once by the
allgather that checks the tiles at the model's entrance; from then on every
rank decides alike from the marks alone, and a refusal is raised on every
rank. Marks live in a registry keyed by the array (a weak reference: a mark
dies with its array) and only while a guarded forward runs; the registry's
code is in ``mnpar._marks``, which tensor parallelism's marks share.

The traffic and the operations mark their outputs, the guard reads the marks
and marks what it lets run; all of it lives in one per-forward state
(``state``, one per thread)::

    scopes   the converted forwards running, innermost last: each its grid, the
             model whose layers errors name, overlap, and whether it has
             gathered its tiles (after ``gather``, unmarked arrays are whole
             images, and chainer's own window functions take them)
    depth    > 0 inside trusted code (a spatial function doing its own sums, a
             node's forward): chainer's functions run unguarded there
    marks    the marks, by array
    calling  the links being called, innermost last (the guard's link hook),
             so that an error names the layer
"""
import functools
from typing import Any, List, NamedTuple, Optional, Tuple, Union

import chainer
import numpy as np

from .. import _marks
from .._marks import array_of as array_of
from ..random import _position
from .traffic._grid import AnyGrid, SpatialGrid


@functools.lru_cache(maxsize=1024)
def _local(grid: AnyGrid, extents: Tuple[int, ...]) -> Tuple[int, ...]:
    return tuple(s.stop - s.start for s in grid.tile_slices(extents))


class Tile(NamedTuple):
    """This rank's tile: ``grid.ndim`` split axes of global ``extents``, then ``tail`` axes.

    ``spread``: a value every rank holds alike, broadcast to a tile's shape
    (``F.scale``'s weight); it meets tiles of any image of that shape.
    """

    grid: AnyGrid
    extents: Tuple[int, ...]
    tail: int = 0
    spread: bool = False

    def local(self) -> Tuple[int, ...]:
        """This rank's extents along the split axes."""
        return _local(self.grid, self.extents)

    def split_axes(self, ndim: int) -> Tuple[int, ...]:
        """Positions of the split axes in an array of ``ndim`` axes."""
        first = ndim - self.tail - len(self.extents)
        return tuple(range(first, first + len(self.extents)))

    def lead(self, ndim: int) -> int:
        """Axes before the split ones (2 for ``(N, C, H, W)``)."""
        return ndim - self.tail - len(self.extents)

    def global_shape(self, shape: Tuple[int, ...]) -> Tuple[int, ...]:
        """The whole array's shape, for a tile of local ``shape``."""
        lead = self.lead(len(shape))
        return tuple(shape[:lead]) + self.extents + tuple(shape[lead + len(self.extents):])

    def describe(self) -> str:
        return f"a tile of an image of extents {self.extents} (grid {self.grid.shape})"


class Flat(NamedTuple):
    """A tile reshaped to ``(N, features)``: this rank's features of the flattened image.

    ``block`` is the whole image's shape after the batch axis, ``first`` the
    position of the first split axis in it; the features are the tile's
    elements in C order.
    """

    grid: AnyGrid
    block: Tuple[int, ...]
    first: int

    def tile(self) -> Tile:
        ndim = len(self.grid.shape)
        return Tile(self.grid, self.block[self.first:self.first + ndim],
                    len(self.block) - self.first - ndim)

    def local_block(self) -> Tuple[int, ...]:
        ndim = len(self.grid.shape)
        return (self.block[:self.first] + self.tile().local()
                + self.block[self.first + ndim:])

    def features(self) -> Any:
        """The global feature index of each of this rank's features (C order)."""
        ndim = len(self.grid.shape)
        slices = (tuple(slice(0, n) for n in self.block[:self.first])
                  + self.grid.tile_slices(self.block[self.first:self.first + ndim])[:ndim]
                  + tuple(slice(0, n) for n in self.block[self.first + ndim:]))
        return np.arange(int(np.prod(self.block))).reshape(self.block)[slices].ravel()

    def describe(self) -> str:
        return f"a flattened tile of an image of shape {self.block} (grid {self.grid.shape})"


class Whole(NamedTuple):
    """The same value on every rank of ``grid`` (``gather``'s output, a global reduction)."""

    grid: AnyGrid

    def describe(self) -> str:
        return "the whole image (the same on every rank)"


Mark = Union[Tile, Flat, Whole]


class Scope(_marks.Scope):
    """One converted forward running (``guard.guarded``): its grid, its model (``root``, the
    model whose layers errors name), its overlap, and whether it has gathered its tiles."""

    def __init__(self, grid: SpatialGrid, root: Optional[chainer.Link], overlap: bool) -> None:
        super().__init__(root)
        self.grid = grid
        self.overlap = overlap
        self.gathered = False


class _State(_marks.Marks[Scope, Mark]):
    """The per-forward state (see the module docstring), one per thread."""

    def __init__(self) -> None:
        super().__init__()
        self.calling: List[chainer.Link] = []


state = _State()
# The state's methods by the package's names: mark_of(x), the mark of a Variable or an
# array (None: unmarked); mark(x, m) while a guarded forward runs; and trusted(), within
# which chainer's functions run unguarded (spatial code that does its own sums).
mark_of = state.mark_of
mark = state.mark
trusted = state.trusted


def gathered() -> bool:
    """True between a ``gather`` and the end of the converted forward that called it."""
    return bool(state.scopes) and state.scopes[-1].gathered


def mark_gathered() -> None:
    """``gather`` ran: inside a converted forward, what follows sees whole images."""
    if state.scopes:
        state.scopes[-1].gathered = True


def active() -> bool:
    """True while a guarded forward runs in this thread (and not inside trusted code)."""
    return bool(state.scopes)


def is_tile(x: Any) -> bool:
    return isinstance(mark_of(x), (Tile, Flat))


def whole_image(x: Any) -> bool:
    """``x`` holds whole images (after ``gather``, or a batch tile), not a tile: chainer's own
    layers take it."""
    m = mark_of(x)
    if isinstance(m, Tile) and m.grid.batch:
        return True  # a batch tile: whole images of this rank's samples
    return isinstance(m, Whole) or (m is None and gathered())


def random_position(array: Any, position: _position.Position) -> Optional[_position.Position]:
    """Where a tile sits in its whole image, for ``mnpar.random``: a random function draws
    the tile's slice of the whole image's numbers (None: ``array`` is no tile)."""
    m = mark_of(array)
    if isinstance(m, Tile) and not m.spread:
        ndim = len(position.shape)
        for axis, extent, rows in zip(m.split_axes(ndim), m.extents,
                                      m.grid.tile_slices(m.extents)):
            position = _position.with_axis(position, axis, rows.start, extent)
        return position
    if isinstance(m, Flat):
        return _position.with_axis(position, 1, m.features(), int(np.prod(m.block)))
    return None


_position.providers.append(random_position)
