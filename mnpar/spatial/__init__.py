"""Spatial parallelism: images and volumes cut into tiles across ranks.

``SpatialGrid`` lays ranks over the spatial axes; ``halo_exchange`` brings
each tile the rows its neighbours hold; the layers and functions here are
chainer's own with ``grid=`` added, and ``convert`` makes an existing model
spatial in one call. See docs/spatial.rst.

Three parts, each a sub-package, each importing only those before it::

    traffic/      the grid, halos, rows, reductions: what moves between ranks
    operations/   windowed functions and links, norms, resize, local, tower
    guard/        rules, verdicts, conversion: exact or refused, while a
                  converted model runs

beside the errors and the marks (``_marks``: what every part knows of an
array, and the per-forward state) and the tiled datasets (``_dataset``).
"""
from ._dataset import TiledDataset, TiledNpyDataset
from ._errors import SpatialError
from .guard._convert import convert, spatial_functions
from .operations._links import (
                         BatchNormalization,
                         Convolution2D,
                         ConvolutionND,
                         Deconvolution2D,
                         DeconvolutionND,
)
from .operations._local import LocalConvolution2D, local_convolution_2d
from .operations._norms import group_normalization
from .operations._resize import resize_images
from .operations._shards import shard_grid
from .operations._tower import Linear
from .operations._windowed import (
                         average_pooling_2d,
                         average_pooling_nd,
                         convolution_2d,
                         convolution_nd,
                         deconvolution_2d,
                         deconvolution_nd,
                         max_pooling_2d,
                         max_pooling_nd,
                         unpooling_2d,
                         unpooling_nd,
)
from .traffic._batch import batch_to_spatial, gather_batch, spatial_to_batch
from .traffic._geometry import GeometryError
from .traffic._grid import SpatialGrid
from .traffic._halo import halo_exchange
from .traffic._whole import gather, mean_squared_error, sum_over_grid

__all__ = [
    "BatchNormalization", "Convolution2D", "ConvolutionND", "Deconvolution2D",
    "DeconvolutionND", "GeometryError", "SpatialGrid", "TiledDataset", "TiledNpyDataset",
    "average_pooling_2d", "average_pooling_nd", "convert", "convolution_2d", "convolution_nd",
    "deconvolution_2d", "deconvolution_nd", "gather", "halo_exchange", "max_pooling_2d",
    "max_pooling_nd", "mean_squared_error", "spatial_functions", "sum_over_grid",
    "SpatialError", "unpooling_2d", "unpooling_nd", "Linear", "LocalConvolution2D",
    "local_convolution_2d", "group_normalization", "resize_images", "shard_grid",
    "spatial_to_batch", "batch_to_spatial", "gather_batch",
]
