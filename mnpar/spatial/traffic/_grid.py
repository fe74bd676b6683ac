"""The grid of ranks that tiles an image, and the global shapes its layers agree on.

Ranks are laid out block by block: ``prod(shape)`` consecutive ranks tile one
group of samples (row-major over the grid's coordinates, so neighbours along
the last axis are neighbouring ranks, usually on one node); further blocks
are data-parallel groups that take other samples. Each rank gets two
communicators: ``spatial_comm`` over its tiles' grid, ``sample_comm`` over
the ranks holding the same tile of other samples (for averaging gradients).

A tile does not tell the global size it was cut from (10 rows split 3 ways
and 11 rows give rank 0 the same 4 rows), so every spatial layer first
gathers the tiles' sizes across the grid: one ``Allgather`` of a few ints,
which also lets every rank find the same inconsistent tile and raise the
same error, where a guess would leave ranks waiting on different messages.

Every collective of spatial parallelism (shapes, sums, halos, rows, gathers)
is posted non-blocking on the grid's own duplicate ``mpi`` and waited for
through ``wait``, which honours the communicator's timeout and names what
waited for whom. ``BatchGrid`` is the same ranks in a row over the batch
axis, for batch tiles (``spatial_to_batch``).
"""
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from mpi4py import MPI

from ..._arrays import get_array_module, to_host
from ..._failfast import failing
from ...communicators._facade import Communicator, require_communicator, wait
from .._errors import SpatialError
from ._geometry import split

WIDTH = 8  # ints per rank in the shape exchange: the rank count of axes, then the shape


def require_grid(grid: object, op: str) -> None:
    """Raises ``TypeError`` naming ``op`` unless ``grid`` is a SpatialGrid."""
    if not isinstance(grid, SpatialGrid):
        raise TypeError(f"{op} needs a SpatialGrid, not {type(grid).__name__} (make one "
                        "with mnpar.spatial.SpatialGrid(comm, shape))")


class SpatialGrid:
    """A grid of ranks over the spatial axes of images (or volumes).

    Args:
        comm: an mnpar communicator. Its size must be a multiple of the grid's
            size ``prod(shape)``; the quotient is the number of sample groups
            (data parallelism across groups, spatial within each).
        shape: ranks along each spatial axis, one to three entries: ``(2,)``
            splits the first spatial axis (height) in two, ``(2, 2)`` height
            and width, ``(1, 1, 2)`` a volume's depth axis... Axes beyond
            ``len(shape)`` are not split.

    Example::

        comm = mnpar.create_communicator("naive")
        grid = mnpar.spatial.SpatialGrid(comm, (1, 2))   # 2 ranks: left, right halves
        x_tile = grid.tile(x)                            # x: (N, C, H, W), on every rank
        conv = mnpar.spatial.Convolution2D(3, 16, 3, pad=1, grid=grid)
        y_tile = conv(x_tile)                            # == grid.tile(conv2d(x))
    """

    batch = False  # a BatchGrid's marks say the batch axis is split

    def __init__(self, comm: Communicator, shape: Sequence[int]) -> None:
        require_communicator(comm, "SpatialGrid")
        try:
            dims = tuple(int(s) for s in shape)
        except TypeError:
            raise TypeError(f"SpatialGrid shape must be a sequence of ints, not {shape!r}") \
                from None
        if not 1 <= len(dims) <= 3 or any(s < 1 for s in dims):
            raise ValueError(f"SpatialGrid shape {tuple(shape)!r} must have 1 to 3 positive "
                             "entries (ranks along each spatial axis)")
        size = math.prod(dims)
        if comm.size % size:
            raise ValueError(f"SpatialGrid shape {dims} needs a multiple of {size} ranks; the "
                             f"communicator has {comm.size} (use a shape whose product "
                             f"divides {comm.size})")
        self.comm = comm
        self.shape = dims
        self.size = size
        self.groups = comm.size // size
        self.group, self.rank = divmod(comm.rank, size)
        self.coords = tuple(int(c) for c in np.unravel_index(self.rank, dims))
        self.spatial_comm = comm.split(self.group, self.rank)
        self.sample_comm = comm.split(self.rank, self.group)
        self.mpi = self.spatial_comm.private_comm.Dup()  # halos travel on their own
        self._extents: Dict[Tuple[int, ...], Tuple[int, ...]] = {}

    def free(self) -> None:
        """Frees the grid's communicators (collective over the grid's communicator);
        called while an exception unwinds, it frees nothing and waits for no peer
        (``failing``: the communicators' ``finalize`` only tells the peers)."""
        if not failing():
            self.mpi.Free()
        self.spatial_comm.finalize()
        self.sample_comm.finalize()

    def __deepcopy__(self, memo: dict) -> "SpatialGrid":
        return self  # a handle on communicators: copies of a model share it

    def __copy__(self) -> "SpatialGrid":
        return self

    def __repr__(self) -> str:
        return (f"SpatialGrid(shape={self.shape}, coords={self.coords}, "
                f"group={self.group} of {self.groups})")

    @property
    def ndim(self) -> int:
        """The number of spatial axes the grid splits."""
        return len(self.shape)

    def neighbour(self, axis: int, step: int) -> Optional[int]:
        """The grid rank one step (``-1`` or ``+1``) along ``axis``, or None at the edge."""
        coords = list(self.coords)
        coords[axis] += step
        if not 0 <= coords[axis] < self.shape[axis]:
            return None
        return int(np.ravel_multi_index(coords, self.shape))

    def tile_slices(self, spatial_shape: Sequence[int],
                    rank: Optional[int] = None) -> Tuple[slice, ...]:
        """This rank's (or grid rank ``rank``'s) slices of a global image's spatial axes.

        Raises:
            ValueError: fewer spatial axes than the grid splits, or an axis with
                fewer rows than ranks.
        """
        spatial = tuple(int(n) for n in spatial_shape)
        if len(spatial) < self.ndim:
            raise ValueError(f"an image with spatial shape {spatial} has fewer axes than the "
                             f"grid {self.shape} splits")
        coords = self.coords if rank is None else np.unravel_index(rank, self.shape)
        out = []
        for axis, n in enumerate(spatial):
            if axis >= self.ndim:
                out.append(slice(0, n))
                continue
            if n < self.shape[axis]:
                raise ValueError(f"spatial axis {axis} has {n} rows, fewer than the grid's "
                                 f"{self.shape[axis]} ranks along it; the image must have at "
                                 f"least {self.shape[axis]}")
            out.append(slice(*split(n, self.shape[axis], int(coords[axis]))))
        return tuple(out)

    def tile(self, x: Any) -> Any:
        """This rank's tile (a contiguous copy) of a global array ``(N, C, *spatial)``."""
        if getattr(x, "ndim", 0) < 2 + self.ndim:
            raise ValueError(f"grid.tile needs an array (N, C, *spatial) with at least "
                             f"{self.ndim} spatial axes, not shape {getattr(x, 'shape', None)}")
        index = (slice(None), slice(None)) + self.tile_slices(x.shape[2:])
        return get_array_module(x).ascontiguousarray(x[index])

    def global_shape(self, local: Sequence[int], what: str, agree: Sequence[int] = (),
                     hint: str = "") -> Tuple[int, ...]:
        """The global ``(N, C, *spatial)`` whose tiles the ranks hold (collective).

        Every rank passes its tile's shape; one ``Allgather`` tells each rank
        every tile's shape, and each checks that they tile one image by the
        balanced rule. ``agree`` (ints, as many on every rank) travels along:
        a layer's arguments, which must be the same on every rank (``hint``
        says what to do where they differ).

        Raises:
            ValueError: on every rank alike, naming ``what`` and the ranks whose
                tiles disagree.
            SpatialError: the ranks pass different ``agree``.
        """
        width = WIDTH + len(agree)
        mine = np.full(width, -1, np.int64)
        if not 2 <= len(local) < WIDTH:
            raise ValueError(f"{what}: a tile of shape {tuple(local)} is not (N, C, *spatial) "
                             "with 1 to 5 spatial axes")
        mine[0] = len(local)
        mine[1:1 + len(local)] = local
        mine[WIDTH:] = agree
        if self.size == 1:
            return tuple(int(v) for v in local)
        rows = np.empty((self.size, width), np.int64)
        self._allgather(mine, rows, what)
        if (rows[:, WIDTH:] != rows[0, WIDTH:]).any():
            raise SpatialError(f"{what}: the ranks of the grid pass different arguments "
                               f"{[tuple(r) for r in rows[:, WIDTH:].tolist()]} (grid ranks "
                               f"0..{self.size - 1}){'; ' + hint if hint else ''}")
        if (rows[:, 0] != len(local)).any():
            raise ValueError(f"{what}: the ranks of the grid hold tiles with different numbers "
                             f"of axes: {rows[:, 0].tolist()}")
        return self._check_tiling(rows[:, 1:1 + len(local)], what)

    def wait(self, requests: List[MPI.Request], what: str,
             whom: str = "every rank of the spatial grid", nbytes: int = 0) -> None:
        """Waits for ``requests`` (the grid's collectives and halos), within the
        communicator's timeout; a ``CommunicationTimeout`` or ``PeerFinished`` names
        ``what`` waited for ``whom``. ``nbytes``: how much they move (a longer spin)."""
        wait(requests, self.spatial_comm.timeout,
             self.spatial_comm.describe(what, None, None, whom), nbytes=nbytes)

    def _allgather(self, mine: np.ndarray, out: np.ndarray, what: str) -> None:
        self.wait([self.mpi.Iallgather(mine, out)], f"{what}: gathering tile shapes")

    def _check_tiling(self, shapes: np.ndarray, what: str) -> Tuple[int, ...]:
        lead = shapes[:, :2]
        if (lead != lead[0]).any():
            raise ValueError(f"{what}: tiles of different batch or channel sizes across "
                             f"the grid: {[tuple(s) for s in lead.tolist()]} "
                             f"(grid ranks 0..{self.size - 1})")
        if shapes.shape[1] - 2 < self.ndim:
            raise ValueError(f"{what}: a tile of shape {tuple(shapes[0])} has fewer spatial axes "
                             f"than the grid {self.shape} splits")
        coords = np.array(np.unravel_index(np.arange(self.size), self.shape)).T
        total: List[int] = []
        for axis in range(shapes.shape[1] - 2):
            sizes = shapes[:, 2 + axis]
            if axis >= self.ndim:
                if (sizes != sizes[0]).any():
                    raise ValueError(f"{what}: spatial axis {axis} is not split, yet the tiles "
                                     f"differ along it: {sizes.tolist()}")
                total.append(int(sizes[0]))
                continue
            line = [r for r in range(self.size)
                    if all(coords[r][a] == 0 for a in range(self.ndim) if a != axis)]
            n = int(sum(sizes[r] for r in line))
            expected = [split(n, self.shape[axis], int(coords[r][axis])) for r in range(self.size)]
            wrong = [r for r in range(self.size) if sizes[r] != expected[r][1] - expected[r][0]]
            if wrong:
                raise ValueError(f"{what}: the tiles along spatial axis {axis} "
                                 f"({sizes.tolist()} rows on grid ranks 0..{self.size - 1}) are "
                                 f"not the balanced tiles of one image of {n} rows; ranks "
                                 f"{wrong} disagree (cut images with grid.tile)")
            total.append(n)
        return tuple(int(v) for v in shapes[0, :2]) + tuple(total)

    def allreduce_sum(self, buf: Any, what: str) -> Any:
        """``buf`` summed over the grid's ranks (collective; a new array)."""
        if self.size == 1:
            return buf
        xp = get_array_module(buf)
        host = np.ascontiguousarray(to_host(buf))
        out = np.empty_like(host)
        self.wait([self.mpi.Iallreduce(host, out, op=MPI.SUM)],
                  f"{what}: summing over the grid", nbytes=host.nbytes)
        return out if xp is np else xp.asarray(out)

    def sum_arrays(self, arrays: Sequence[Any], what: str) -> List[Any]:
        """Each array summed over the grid's ranks, packed into one float64 allreduce
        (None entries stay None)."""
        present = [a for a in arrays if a is not None]
        if not present:
            return list(arrays)
        xp = get_array_module(present[0])
        total = self.allreduce_sum(xp.concatenate([a.ravel().astype(np.float64)
                                                   for a in present]), what)
        out: List[Any] = []
        at = 0
        for a in arrays:
            if a is None:
                out.append(None)
                continue
            out.append(total[at:at + a.size].reshape(a.shape).astype(a.dtype))
            at += a.size
        return out


class BatchGrid:
    """The grid's ranks in a row over the batch axis: a batch tile's mark refers to it."""

    batch = True

    def __init__(self, grid: SpatialGrid) -> None:
        self.grid = grid
        self.shape = (grid.size,)
        self.ndim = 1
        self.size = grid.size
        self.rank = grid.rank
        self.coords = (grid.rank,)
        self.mpi = grid.mpi
        self.spatial_comm = grid.spatial_comm

    def tile_slices(self, extents: Sequence[int],
                    rank: Optional[int] = None) -> Tuple[slice, ...]:
        r = self.rank if rank is None else int(rank)
        return (slice(*split(int(extents[0]), self.size, r)),) + tuple(
            slice(0, int(n)) for n in extents[1:])

    def neighbour(self, axis: int, step: int) -> Optional[int]:
        r = self.rank + step
        return r if 0 <= r < self.size else None

    def wait(self, requests: List[MPI.Request], what: str,
             whom: str = "every rank of the spatial grid", nbytes: int = 0) -> None:
        self.grid.wait(requests, what, whom, nbytes)

    def sum_arrays(self, arrays: Sequence[Any], what: str) -> List[Any]:
        return self.grid.sum_arrays(arrays, what)

    def allreduce_sum(self, buf: Any, what: str) -> Any:
        return self.grid.allreduce_sum(buf, what)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BatchGrid) and other.grid is self.grid

    def __hash__(self) -> int:
        return hash(("batch", id(self.grid)))

    def __repr__(self) -> str:
        return f"the batch over the {self.size} ranks of the grid {self.grid.shape}"


# What a mark's grid is: the tiles' grid, or its ranks over the batch axis.
AnyGrid = Union[SpatialGrid, BatchGrid]
