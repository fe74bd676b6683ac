"""Normalizations across pixels: statistics over the whole image, from tiles.

Group normalization normalizes each sample's group of channels over all its
pixels; layer normalization of a flattened image each sample over all its
features. On tiles both need the whole image's mean and variance per row
``(sample, group)``. ``GridNormalize`` computes them exactly, as chainer
does (the mean, then the mean of squared deviations from it), with sums in
float64 over the grid::

    forward    allreduce [Σx]          -> mean;   allreduce [Σ(x - mean)²] -> variance
    backward   allreduce [Σg, Σg·x̂]    -> gx = (g - Σg/n - x̂ Σg·x̂/n) / σ

The scale and shift that follow are per channel (group normalization) or
per feature (layer normalization: this rank's features of ``gamma`` and
``beta``); their gradients are summed over the grid.
"""
from typing import Any, Tuple

import chainer
import chainer.functions as F
import numpy as np

from ..._arrays import get_array_module
from .._errors import SpatialError
from .._marks import Flat, Tile, Whole, mark, mark_of, trusted
from ..traffic._grid import AnyGrid, SpatialGrid, require_grid
from ..traffic._halo import no_second_order
from ..traffic._reduce import allreduce
from ..traffic._sums import sum_grads


class GridNormalize(chainer.FunctionNode):
    """Each row of ``(R, L)`` normalized over its ``count`` elements on the whole grid."""

    def __init__(self, grid: AnyGrid, count: int, eps: float, what: str) -> None:
        self.grid = grid
        self.count = count
        self.eps = eps
        self.what = what

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, = inputs
        xp = get_array_module(x)
        total = allreduce(self.grid, x.sum(axis=1, dtype=np.float64), "sum", self.what)
        mean = (total / self.count).astype(x.dtype)
        d = x - mean[:, None]
        sq = allreduce(self.grid, (d * d).sum(axis=1, dtype=np.float64), "sum", self.what)
        var = (sq / self.count).astype(x.dtype) + x.dtype.type(self.eps)
        self.inv_std = xp.reciprocal(xp.sqrt(var))
        self.x_hat = d * self.inv_std[:, None]
        return self.x_hat,

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        no_second_order(self.what)
        g = grad_outputs[0].array
        xp = get_array_module(g)
        sums = xp.concatenate([g.sum(axis=1, dtype=np.float64),
                               (g * self.x_hat).sum(axis=1, dtype=np.float64)])
        sums = allreduce(self.grid, sums, "sum", self.what) / self.count
        rows = g.shape[0]
        mean_g = sums[:rows].astype(g.dtype)[:, None]
        mean_gx = sums[rows:].astype(g.dtype)[:, None]
        gx = (g - mean_g - self.x_hat * mean_gx) * self.inv_std[:, None]
        return chainer.Variable(gx),


def group_normalization(x: Any, groups: int, gamma: Any, beta: Any, eps: float = 1e-5, *,
                        grid: SpatialGrid) -> chainer.Variable:
    """``F.group_normalization`` of the whole image, from this rank's tile."""
    what = "spatial group normalization"
    require_grid(grid, what)
    m = mark_of(x)
    if isinstance(m, (Whole, Flat)) or (isinstance(m, Tile) and m.lead(len(x.shape)) != 2):
        raise SpatialError(f"{what} takes (N, C, *spatial) tiles")
    n, c = x.shape[:2]
    if c % groups:
        raise ValueError(f"{what}: {c} channels are not divisible into {groups} groups")
    whole = grid.global_shape(x.shape, what, [groups])
    count = (c // groups) * int(np.prod(whole[2:]))
    with trusted():
        gamma, beta = sum_grads(grid, (gamma, beta), what)
        x_hat = GridNormalize(grid, count, eps, what).apply((F.reshape(x, (n * groups, -1)),))[0]
        y = F.reshape(x_hat, (n, c, -1))
        y = y * F.broadcast_to(F.reshape(gamma, (1, c, 1)), y.shape) + \
            F.broadcast_to(F.reshape(beta, (1, c, 1)), y.shape)
        y = F.reshape(y, x.shape)
    return mark(y, m) if isinstance(m, Tile) else y


def flat_layer_normalization(x: Any, flat: Flat, gamma: Any, beta: Any,
                             eps: float = 1e-5) -> chainer.Variable:
    """``F.layer_normalization`` of whole flattened images, from this rank's features."""
    what = "spatial layer normalization"
    grid = flat.grid
    features = flat.features()
    n_all = int(np.prod(flat.block))
    if gamma.shape[0] != n_all:
        raise SpatialError(f"{what}: gamma has {gamma.shape[0]} entries for {n_all} features "
                           f"{flat.block}")
    with trusted():
        gamma, beta = sum_grads(grid, (gamma, beta), what)
        x_hat = GridNormalize(grid, n_all, eps, what).apply((x,))[0]
        y = x_hat * F.broadcast_to(gamma[features][None], x_hat.shape) + \
            F.broadcast_to(beta[features][None], x_hat.shape)
    return mark(y, flat)
