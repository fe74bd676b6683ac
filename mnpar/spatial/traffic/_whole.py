"""From tiles back to whole images and whole-image losses.

Past the convolutions a model often needs the whole image (a fully connected
layer, a global loss). These functions give every rank of the grid the same
whole-image value, and their backward passes hand each rank the gradient of
its own part as *one* replicated computation would: every rank runs the same
layers after ``gather`` or ``sum_over_grid`` and gets the same gradient, so
the backward takes this rank's share of it rather than summing the ranks'
identical copies.

    tiles --gather--> whole image on every rank --> same layers everywhere
    tile loss --sum_over_grid--> whole-image loss on every rank
"""
from typing import Any, Tuple

import chainer
import chainer.functions as F
import numpy as np

from ..._arrays import device_of, get_array_module, to_host
from .._errors import SpatialError
from .._marks import Whole, mark, mark_gathered, state, trusted
from ._grid import AnyGrid, SpatialGrid, require_grid


class Gather(chainer.FunctionNode):
    """``gather``'s node: an allgather of the tiles, backward this rank's tile."""

    def __init__(self, grid: SpatialGrid) -> None:
        self.grid = grid

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, = inputs
        grid = self.grid
        shape = grid.global_shape(x.shape, "spatial gather")
        self.shape = shape
        lead = (slice(None), slice(None))
        self.own = lead + grid.tile_slices(shape[2:])
        if grid.size == 1:
            return x.copy(),
        xp = get_array_module(x)
        host = np.ascontiguousarray(to_host(x))
        index = [lead + grid.tile_slices(shape[2:], r) for r in range(grid.size)]
        counts = [int(np.prod([s.stop - s.start for s in i[2:]])) * shape[0] * shape[1]
                  for i in index]
        flat = np.empty(sum(counts), dtype=x.dtype)
        grid.wait([grid.mpi.Iallgatherv(host, [flat, counts])], "spatial gather",
                  nbytes=flat.nbytes)
        whole = np.empty(shape, dtype=x.dtype)
        at = 0
        for i, c in zip(index, counts):
            whole[i] = flat[at:at + c].reshape(whole[i].shape)
            at += c
        with device_of(x):
            return (whole if xp is np else xp.asarray(whole)),

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        return grad_outputs[0][self.own],


def gather(x: Any, grid: SpatialGrid) -> chainer.Variable:
    """The whole images ``(N, C, *spatial)`` on every rank of the grid, from its tiles.

    Layers after it run on every rank alike (replicated), and their parameter
    gradients are those of the whole image already. The backward pass gives
    each rank the gradient of its own tile. In the forward of a model made
    spatial by ``convert``, the convolutions, pooling and batch normalization
    after it are chainer's own (they see whole images).
    """
    require_grid(grid, "gather")
    with trusted():
        y = Gather(grid).apply((x,))[0]
    mark_gathered()
    return mark(y, Whole(grid))


class SumOverGrid(chainer.FunctionNode):
    """``sum_over_grid``'s node: an allreduce, backward the identity (see the module)."""

    def __init__(self, grid: AnyGrid) -> None:
        self.grid = grid

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, = inputs
        xp = get_array_module(x)
        total = self.grid.allreduce_sum(xp.asarray(x, dtype=np.float64), "sum_over_grid")
        return xp.asarray(total).astype(x.dtype, copy=False).reshape(x.shape),

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        return grad_outputs[0],


def sum_over_grid(x: Any, grid: SpatialGrid) -> chainer.Variable:
    """``x`` summed over the ranks of the grid (every rank gets the sum).

    For a loss made of per-tile parts: ``sum_over_grid(F.sum(err_tile), grid)``
    is the whole image's ``F.sum(err)``, and its gradient reaches each tile
    as the whole image's would (each rank backpropagates the same value once).
    """
    require_grid(grid, "sum_over_grid")
    if not state.depth and any(scope.root is not None for scope in state.scopes):
        raise SpatialError("sum_over_grid inside a converted model: there F.sum and F.mean "
                           "over a tile already cover the whole image; sum_over_grid is for "
                           "losses computed on the model's output tiles, outside it")
    with trusted():
        y = SumOverGrid(grid).apply((x,))[0]
    return mark(y, Whole(grid))


def mean_squared_error(y: Any, t: Any, grid: SpatialGrid) -> chainer.Variable:
    """``F.mean_squared_error`` of the whole images, from tiles: the same on every rank."""
    require_grid(grid, "mean_squared_error")
    ys = y.shape if hasattr(y, "shape") else np.shape(y)
    total = grid.global_shape(ys, "spatial mean_squared_error")
    count = int(np.prod(total))
    with trusted():
        err = F.sum(F.squared_difference(y, t))
        whole: Any = sum_over_grid(err, grid)
        whole = whole * (1.0 / count)
    return mark(whole, Whole(grid))

