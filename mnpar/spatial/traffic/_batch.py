"""From tiles to whole images of a share of the batch, and back.

Past the convolutions that need spatial parallelism, the images are small
and the rest of the model could run data parallel: ``spatial_to_batch``
gives each rank of the grid the whole images of its share of the batch
(one ``Alltoallv``: every rank sends each other rank its tiles of that
rank's samples), ``batch_to_spatial`` cuts them back into tiles::

    tiles (N, C, h_r, w_r) on every rank  --spatial_to_batch-->  (N_r, C, H, W) on rank r
                                          <--batch_to_spatial--

where ``N_r`` is rank r's balanced share of the ``N`` samples. Inside a
converted model the shares are *batch tiles*: the guard treats the batch
as the split axis, so chainer's own per-sample layers (convolutions,
pooling, ``Linear``...) run on them as they are, their parameters'
gradients are summed over the grid, reductions over the batch are one
allreduce, and ``gather_batch`` gives every rank the whole batch (for a
loss computed outside the model).
"""
from typing import Any, List, Sequence, Tuple

import chainer
import numpy as np

from ..._arrays import device_of, get_array_module, to_host
from .._errors import SpatialError
from .._marks import Tile, Whole, mark, mark_of, trusted
from ._geometry import split
from ._grid import BatchGrid, SpatialGrid, require_grid
from ._halo import no_second_order


def is_batch_tile(x: Any) -> bool:
    m = mark_of(x)
    return isinstance(m, Tile) and isinstance(m.grid, BatchGrid)


def _alltoallv(grid: SpatialGrid, parts: Sequence[np.ndarray], counts: Sequence[int], dtype: Any,
               what: str) -> List[np.ndarray]:
    """``parts[q]`` to grid rank q; ``counts[q]`` elements back from each (flat arrays)."""
    if grid.size == 1:
        return [np.ascontiguousarray(parts[0]).reshape(-1)]
    send_counts = np.array([p.size for p in parts], np.int64)
    recv_counts = np.array(counts, np.int64)
    sendbuf = np.concatenate([np.ascontiguousarray(p).reshape(-1) for p in parts]
                             + [np.empty(0, dtype)]).astype(dtype, copy=False)
    recvbuf = np.empty(int(recv_counts.sum()), dtype)
    sdispl = np.concatenate([[0], np.cumsum(send_counts)[:-1]])
    rdispl = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
    req = grid.mpi.Ialltoallv([sendbuf, (send_counts, sdispl)], [recvbuf, (recv_counts, rdispl)])
    grid.wait([req], what, nbytes=recvbuf.nbytes)
    return [recvbuf[int(d):int(d) + int(c)] for d, c in zip(rdispl, recv_counts)]


class Redistribute(chainer.FunctionNode):
    """Tiles to batch shares (``to_batch``) or back; the backward is the other way."""

    def __init__(self, grid: SpatialGrid, shape: Tuple[int, ...], to_batch: bool) -> None:
        self.grid = grid
        self.shape = shape  # the whole (N, C, *spatial)
        self.to_batch = to_batch

    def _samples(self, r: int) -> slice:
        return slice(*split(self.shape[0], self.grid.size, r))

    def _tile(self, r: int) -> Tuple[slice, ...]:
        return self.grid.tile_slices(self.shape[2:], r)

    def _move(self, x: Any, to_batch: bool, what: str) -> Any:
        xp = get_array_module(x)
        host = to_host(x)
        g, lead = self.grid, self.shape[1:2]
        if to_batch:  # my tile of each rank's samples out; every rank's tile of mine in
            parts = [host[self._samples(q)] for q in range(g.size)]
            mine = self._samples(g.rank)
            counts = [(mine.stop - mine.start) * lead[0]
                      * int(np.prod([s.stop - s.start for s in self._tile(r)]))
                      for r in range(g.size)]
            got = _alltoallv(g, parts, counts, host.dtype, what)
            out = np.empty((mine.stop - mine.start,) + self.shape[1:], host.dtype)
            for r, flat in enumerate(got):
                index = (slice(None), slice(None)) + self._tile(r)
                out[index] = flat.reshape(out[index].shape)
        else:  # each rank's tile of my samples out; my tile of every rank's samples in
            parts = [np.ascontiguousarray(host[(slice(None), slice(None)) + self._tile(q)])
                     for q in range(g.size)]
            tile_shape = tuple(s.stop - s.start for s in self._tile(g.rank))
            counts = [(self._samples(r).stop - self._samples(r).start) * lead[0] *
                      int(np.prod(tile_shape)) for r in range(g.size)]
            got = _alltoallv(g, parts, counts, host.dtype, what)
            out = np.empty((self.shape[0], lead[0]) + tile_shape, host.dtype)
            for r, flat in enumerate(got):
                out[self._samples(r)] = flat.reshape(out[self._samples(r)].shape)
        with device_of(x):
            return out if xp is np else xp.asarray(out)

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        what = "spatial_to_batch" if self.to_batch else "batch_to_spatial"
        return self._move(inputs[0], self.to_batch, what),

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        what = "spatial_to_batch" if self.to_batch else "batch_to_spatial"
        no_second_order(what)
        return chainer.Variable(self._move(grad_outputs[0].array, not self.to_batch,
                                           f"{what} (backward)")),


def spatial_to_batch(x: Any, grid: SpatialGrid) -> chainer.Variable:
    """The whole images ``(N_r, C, *spatial)`` of this rank's share of the batch, from tiles.

    Collective over the grid. Inside a converted model the result is a batch
    tile: chainer's per-sample layers take it as it is (see the module).

    Raises:
        SpatialError: fewer samples than ranks in the grid, or not a tile.
    """
    require_grid(grid, "spatial_to_batch")
    m = mark_of(x)
    if m is not None and not (isinstance(m, Tile) and m.grid is grid
                              and m.lead(len(x.shape)) == 2):
        raise SpatialError(f"spatial_to_batch takes (N, C, *spatial) tiles of this grid, not "
                           f"{m.describe()}")
    shape = grid.global_shape(x.shape, "spatial_to_batch")
    if shape[0] < grid.size:
        raise SpatialError(f"spatial_to_batch: a batch of {shape[0]} for the {grid.size} ranks "
                           "of the grid; give it at least one sample per rank")
    with trusted():
        y = Redistribute(grid, shape, True).apply((x,))[0]
    return mark(y, Tile(BatchGrid(grid), (shape[0],), len(shape) - 1))


def batch_to_spatial(x: Any, grid: SpatialGrid) -> chainer.Variable:
    """This rank's tiles ``(N, C, *tile)`` of the whole batch, from each rank's share of whole
    images (``spatial_to_batch``'s output, or any batch tile). Collective over the grid."""
    require_grid(grid, "batch_to_spatial")
    m = mark_of(x)
    if m is not None and not (isinstance(m, Tile) and m.grid == BatchGrid(grid)):
        raise SpatialError(f"batch_to_spatial takes a batch tile of this grid, not "
                           f"{m.describe()}")
    counts = _counts(grid, int(x.shape[0]), "batch_to_spatial")
    n = int(sum(counts))
    if [split(n, grid.size, r)[1] - split(n, grid.size, r)[0] for r in range(grid.size)] \
            != list(counts):
        raise SpatialError(f"batch_to_spatial: the ranks hold {counts} samples, not the "
                           f"balanced shares of {n}")
    shape = (n,) + tuple(x.shape[1:])
    with trusted():
        y = Redistribute(grid, shape, False).apply((x,))[0]
    return mark(y, Tile(grid, shape[2:2 + grid.ndim], len(shape) - 2 - grid.ndim))


def _counts(grid: SpatialGrid, n: int, what: str) -> List[int]:
    """Every rank's ``n`` (one allgather of ints, bounded by the grid's timeout)."""
    if grid.size == 1:
        return [n]
    out = np.empty(grid.size, np.int64)
    grid.wait([grid.mpi.Iallgather(np.array([n], np.int64), out)],
              f"{what}: gathering batch sizes")
    return [int(v) for v in out]


class GatherBatch(chainer.FunctionNode):
    """Every rank's share of the batch, on every rank; backward: this rank's share."""

    def __init__(self, grid: SpatialGrid) -> None:
        self.grid = grid

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, = inputs
        xp = get_array_module(x)
        host = np.ascontiguousarray(to_host(x))
        rows = _counts(self.grid, len(host), "gather_batch")
        width = int(np.prod(host.shape[1:]))
        whole = np.empty((sum(rows),) + host.shape[1:], host.dtype)
        if self.grid.size == 1:
            whole[...] = host
        else:
            counts = [r * width for r in rows]
            self.grid.wait([self.grid.mpi.Iallgatherv(host, [whole, counts])], "gather_batch",
                           nbytes=whole.nbytes)
        start = sum(rows[:self.grid.rank])
        self.mine = slice(start, start + rows[self.grid.rank])
        with device_of(x):
            return (whole if xp is np else xp.asarray(whole)),

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        return grad_outputs[0][self.mine],


def gather_batch(x: Any, grid: SpatialGrid) -> chainer.Variable:
    """The whole batch on every rank, from each rank's share (a batch tile)."""
    require_grid(grid, "gather_batch")
    with trusted():
        y = GatherBatch(grid).apply((x,))[0]
    return mark(y, Whole(grid))
