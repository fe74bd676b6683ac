"""Spatial links: chainer's convolution, deconvolution and batch normalization links,
with ``grid=`` added.

Each is a subclass of chainer's link with the same parameters, names and
initialization, so a model's snapshots, optimizers and ``copyparams`` work
unchanged; only ``forward`` differs, calling the spatial function on the
tile. ``convert`` turns a chainer link into its spatial subclass in place.
"""
from typing import Any, Optional

import chainer
import chainer.functions as F
import chainer.links as L

from ...functions._global_batch_norm import normalize_batch
from .._marks import Tile, mark, mark_of, trusted, whole_image
from ..traffic._grid import SpatialGrid, require_grid
from ..traffic._sums import SumGrads
from ._shards import Replicas, replicas
from ._windowed import convolution_nd, deconvolution_nd


def _sizes(outsize: Any) -> Optional[Any]:
    """chainer's ``(None, None)`` outsize as None."""
    if outsize is None or all(v is None for v in outsize):
        return None
    return outsize


class _OnGrid:
    """The grid a spatial link runs on (``copy.deepcopy`` shares it: see SpatialGrid)."""

    grid: SpatialGrid
    overlap: bool = True

    def _on_grid(self, grid: SpatialGrid, overlap: bool) -> None:
        require_grid(grid, type(self).__name__)
        self.grid = grid
        self.overlap = overlap

    def mnpar_replicas(self) -> Replicas:
        """Its parameters that every rank of the grid holds alike (gradient clipping
        counts each once)."""
        return replicas(self.grid, self.params())  # type: ignore[attr-defined]


class _WindowOnGrid(_OnGrid):
    """The forward of the spatial convolution and deconvolution links."""

    W: Any

    def forward(self, x: Any) -> chainer.Variable:
        """chainer's forward on this rank's tile (chainer's own after ``gather``)."""
        if self.W.array is None:
            self._initialize_params(x.shape[1])  # type: ignore[attr-defined]
        if whole_image(x):
            return super().forward(x)  # type: ignore[misc]
        return self._on_tiles(x)

    def _on_tiles(self, x: Any) -> chainer.Variable:
        raise NotImplementedError


class Convolution2D(_WindowOnGrid, L.Convolution2D):
    """``chainer.links.Convolution2D`` on tiles: its arguments, plus ``grid`` and ``overlap``.

    Example::

        conv = mnpar.spatial.Convolution2D(3, 16, 3, pad=1, grid=grid)
        y = conv(grid.tile(x))              # == grid.tile(L.Convolution2D(...)(x))
    """

    def __init__(self, in_channels: Any, out_channels: Any = None, ksize: Any = None,
                 stride: Any = 1, pad: Any = 0, nobias: bool = False, initialW: Any = None,
                 initial_bias: Any = None, *, grid: SpatialGrid, overlap: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(in_channels, out_channels, ksize, stride, pad, nobias, initialW,
                         initial_bias, **kwargs)
        self._on_grid(grid, overlap)

    def _on_tiles(self, x: Any) -> chainer.Variable:
        return convolution_nd(x, self.W, self.b, self.stride, self.pad, False, self.dilate,
                                self.groups, grid=self.grid, overlap=self.overlap,
                                name=self.name)


class ConvolutionND(_WindowOnGrid, L.ConvolutionND):
    """``chainer.links.ConvolutionND`` on tiles (volumes: ``ndim=3``), plus ``grid``."""

    def __init__(self, ndim: int, in_channels: Any, out_channels: Any, ksize: Any = None,
                 stride: Any = 1, pad: Any = 0, nobias: bool = False, initialW: Any = None,
                 initial_bias: Any = None, cover_all: bool = False, dilate: Any = 1,
                 groups: int = 1, *, grid: SpatialGrid, overlap: bool = True) -> None:
        super().__init__(ndim, in_channels, out_channels, ksize, stride, pad, nobias,
                         initialW, initial_bias, cover_all, dilate, groups)
        self._on_grid(grid, overlap)

    def _on_tiles(self, x: Any) -> chainer.Variable:
        return convolution_nd(x, self.W, self.b, self.stride, self.pad, self.cover_all,
                                self.dilate, self.groups, grid=self.grid, overlap=self.overlap,
                                name=self.name)


class Deconvolution2D(_WindowOnGrid, L.Deconvolution2D):
    """``chainer.links.Deconvolution2D`` on tiles (``outsize`` is the whole image's)."""

    def __init__(self, in_channels: Any, out_channels: Any = None, ksize: Any = None,
                 stride: Any = 1, pad: Any = 0, nobias: bool = False, outsize: Any = None,
                 initialW: Any = None, initial_bias: Any = None, *, grid: SpatialGrid,
                 overlap: bool = True, **kwargs: Any) -> None:
        super().__init__(in_channels, out_channels, ksize, stride, pad, nobias, outsize,
                         initialW, initial_bias, **kwargs)
        self._on_grid(grid, overlap)

    def _on_tiles(self, x: Any) -> chainer.Variable:
        return deconvolution_nd(x, self.W, self.b, self.stride, self.pad, _sizes(self.outsize),
                                  self.dilate, self.groups, grid=self.grid, overlap=self.overlap,
                                  name=self.name)


class DeconvolutionND(_WindowOnGrid, L.DeconvolutionND):
    """``chainer.links.DeconvolutionND`` on tiles, plus ``grid``."""

    def __init__(self, ndim: int, in_channels: Any, out_channels: Any, ksize: Any = None,
                 stride: Any = 1, pad: Any = 0, nobias: bool = False, outsize: Any = None,
                 initialW: Any = None, initial_bias: Any = None, dilate: Any = 1,
                 groups: int = 1, *, grid: SpatialGrid, overlap: bool = True) -> None:
        super().__init__(ndim, in_channels, out_channels, ksize, stride, pad, nobias,
                         outsize, initialW, initial_bias, dilate, groups)
        self._on_grid(grid, overlap)

    def _on_tiles(self, x: Any) -> chainer.Variable:
        return deconvolution_nd(x, self.W, self.b, self.stride, self.pad, _sizes(self.outsize),
                                  self.dilate, self.groups, grid=self.grid, overlap=self.overlap,
                                  name=self.name)


class BatchNormalization(_OnGrid, L.BatchNormalization):
    """``chainer.links.BatchNormalization`` over the whole image and batch, plus ``grid``.

    In training, the statistics are those of every pixel of every tile of the
    grid's samples: one packed allreduce of per-channel sums forward and one
    backward (exact for uneven tiles). ``gamma``'s and ``beta``'s gradients
    are the whole image's, the same on every rank. The running averages use
    the whole count. In test mode nothing is communicated.
    """

    def __init__(self, size: Any = None, decay: float = 0.9, eps: float = 2e-5,
                 dtype: Any = None, use_gamma: bool = True, use_beta: bool = True,
                 initial_gamma: Any = None, initial_beta: Any = None, axis: Any = None,
                 initial_avg_mean: Any = None, initial_avg_var: Any = None, *,
                 grid: SpatialGrid) -> None:
        if axis is not None:
            raise ValueError("spatial BatchNormalization normalizes over the batch and the "
                             f"spatial axes; axis={axis!r} is not supported")
        super().__init__(size, decay, eps, dtype, use_gamma, use_beta, initial_gamma,
                         initial_beta, axis, initial_avg_mean, initial_avg_var)
        self._on_grid(grid, True)

    def forward(self, x: Any, finetune: bool = False, **kwargs: Any) -> chainer.Variable:
        if whole_image(x):
            return super().forward(x, finetune=finetune, **kwargs)
        tile = mark_of(x)
        with trusted():
            y = self._on_tiles(x, finetune)
        return mark(y, tile) if isinstance(tile, Tile) else y

    def _on_tiles(self, x: Any, finetune: bool) -> chainer.Variable:
        if self.avg_mean is None:
            self._initialize_params(x.shape[1:2])
        gamma = self.gamma
        if gamma is None:
            gamma, = self._get_gamma()
        beta = self.beta
        if beta is None:
            beta, = self._get_beta()
        if not chainer.config.train:  # the tile's share of gamma's and beta's gradients
            gamma, beta = SumGrads(self.grid, "batch normalization").apply((gamma, beta))
            return F.fixed_batch_normalization(x, gamma, beta, self.avg_mean, self.avg_var,
                                               self.eps)
        return normalize_batch(self, x, gamma, beta, finetune, self.grid.spatial_comm, "mpi",
                               mean_param_grads=False)
