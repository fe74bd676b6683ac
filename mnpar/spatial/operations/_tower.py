"""The tower: a fully connected layer on tiles, summing partial products instead of gathering.

``W @ x`` over a flattened image is a sum over its pixels; each rank holds
its tile's pixels, multiplies them by the columns of ``W`` that belong to
them, and one allreduce of the ``(N, out)`` partial products gives every
rank the whole product (neon's "tower")::

    rank r:  y_r = W[:, cols(r)] @ x_r.ravel()      (cols(r): the tile's features, C order)
    all:     y   = sum_r y_r + b                     (one allreduce of N x out numbers)

No image is gathered. ``mnpar.spatial.Linear`` keeps only its tile's columns
(memory W/P, no gradient sum: each rank's columns are its own); ``b`` and
everything after the tower are the same on every rank. Chainer's
``F.linear`` on a tile inside a converted model runs the same sum with the
whole ``W`` (``flat_linear``: its gradient then is summed over the grid).
"""
from typing import Any, Optional

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from .._errors import SpatialError
from .._marks import Flat, Mark, Tile, Whole, mark, mark_of, state, trusted, whole_image
from ..traffic._grid import SpatialGrid
from ..traffic._sums import sum_grads
from ..traffic._whole import SumOverGrid
from ._links import _OnGrid
from ._shards import HINT, Sharded


def flat_linear(x: Any, flat: Flat, W: Any, b: Any = None) -> chainer.Variable:
    """``F.linear`` of a flattened tile with the whole ``W``: the whole image's product."""
    grid = flat.grid
    features = flat.features()
    if W.shape[1] != int(np.prod(flat.block)):
        raise SpatialError(f"F.linear: W has {W.shape[1]} columns for a flattened image of "
                           f"{int(np.prod(flat.block))} features {flat.block}")
    with trusted():
        W, = sum_grads(grid, (W,), "F.linear's W")
        part = F.linear(x, W[:, features])
        y = SumOverGrid(grid).apply((part,))[0]
        if b is not None:
            y = F.bias(y, b)
    return mark(y, Whole(grid))


class Linear(Sharded, _OnGrid, L.Linear):
    """``chainer.links.Linear`` on tiles: each rank keeps the columns of its tile's pixels.

    Takes a tile ``(N, C, *spatial)`` (or a tile flattened to ``(N, -1)``
    inside a converted model) and returns the whole ``(N, out_size)`` on
    every rank, equal to chainer's Linear on the whole flattened image. At
    its first forward on tiles the link keeps only its columns of ``W``
    (drawn whole first, so the values are one process's); ``in_size`` is the
    whole image's ``C * H * W`` (or None). On whole inputs (after
    ``gather``) it is chainer's Linear, until it has been cut.

    Example::

        fc = mnpar.spatial.Linear(16 * 28 * 28, 10, grid=grid)
        y = fc(h_tile)                      # (N, 10) on every rank
    """

    sharded_names = ("W",)

    def __init__(self, in_size: Any, out_size: Any = None, nobias: bool = False,
                 initialW: Any = None, initial_bias: Any = None, *, grid: SpatialGrid) -> None:
        super().__init__(in_size, out_size, nobias, initialW, initial_bias)
        self._on_grid(grid, True)

    def _on_grid(self, grid: SpatialGrid, overlap: bool) -> None:
        super()._on_grid(grid, overlap)
        if not hasattr(self, "shard"):
            self._init_shard()

    def forward(self, x: Any, n_batch_axes: int = 1) -> chainer.Variable:
        m = mark_of(x)
        tile = not whole_image(x) and (isinstance(m, (Tile, Flat)) or (
            m is None and not state.scopes and len(x.shape) >= 2 + self.grid.ndim))
        what = f"spatial Linear {self.name!r}" if self.name else "spatial Linear"
        if not tile:
            self._whole_only(what)
            return super().forward(x, n_batch_axes)
        if n_batch_axes != 1:
            raise SpatialError(f"{what}: n_batch_axes={n_batch_axes} on tiles; the tower "
                               "takes (N, C, *spatial) tiles")
        flat = self._flat(x, m, what)
        features = flat.features()
        n_in = int(np.prod(flat.block))
        if self.W.array is None:
            self._initialize_params(n_in)
        if not self.is_sharded:
            if self.W.shape[1] != n_in:
                raise SpatialError(f"{what}: W has {self.W.shape[1]} columns, but the whole "
                                   f"image {flat.block} has {n_in} features")
            W: Any = self.W.array
            self._set_shards({"W": W[:, features]}, flat.block)
        elif self._layout() != tuple(flat.block):
            raise SpatialError(f"{what} holds the columns of images {self._layout()}, not "
                               f"{flat.block}")
        with trusted():
            part = F.linear(F.reshape(x, (x.shape[0], -1)), self.W)
            y = SumOverGrid(self.grid).apply((part,))[0]
            if self.b is not None:
                y = F.bias(y, self.b)
        return mark(y, Whole(self.grid))

    def _flat(self, x: Any, m: Optional[Mark], what: str) -> Flat:
        """The flattened image this rank's input is part of (collective: shapes and shards
        checked on every rank)."""
        if isinstance(m, Flat):
            if m.first != 1:
                raise SpatialError(f"{what} takes (N, C, *spatial) tiles, flattened or not")
            shape = (x.shape[0],) + tuple(m.local_block())
        elif isinstance(m, Tile) and m.lead(len(x.shape)) != 2:
            raise SpatialError(f"{what} takes (N, C, *spatial) tiles; this one has its split "
                               f"axes at {m.split_axes(len(x.shape))}")
        else:
            shape = tuple(x.shape)
        whole = self.grid.global_shape(shape, what, [self._mine()], HINT)
        self._check_mine(what)
        return Flat(self.grid, tuple(whole[1:]), 1)
