"""The guard's rules for chainer functions that have a spatial version in ``operations/``.

Each reads the chainer node about to run on a tile (its attributes are the
arguments the function was called with) and hands it to the spatial
version, which computes the whole image's result in global coordinates:

==============================  ====================================  =====================
node                            attributes read                       spatial version
==============================  ====================================  =====================
``Convolution2DFunction``,      stride, pad, cover_all, dilate,       ``convolution_nd``
``ConvolutionND``               groups
``Deconvolution2DFunction``,    stride, pad, outsize, dilate, groups  ``deconvolution_nd``
``DeconvolutionND``
``MaxPoolingND``                ksize, stride, pad, cover_all         ``max_pooling_nd``
``AveragePooling2D``,           ksize, stride, pad, pad_value         ``average_pooling_nd``
``AveragePoolingND``
``Unpooling2D``,                ksize, stride, pad, outsize,          ``unpooling_nd``
``UnpoolingND``                 cover_all
``ResizeImages``                output size, mode, align_corners      ``resize_images``
``GroupNormalization``          groups, eps                           ``group_normalization``
``LayerNormalization``          eps (on a flattened tile)             ``flat_layer_``
                                                                      ``normalization``
``LinearFunction``              (on a flattened tile)                 ``flat_linear``
``LocalConvolution2DFunction``  stride                                ``local_convolution_2d``
==============================  ====================================  =====================

The window functions (``WINDOWS``) are converted however chainer was called
(``F.convolution_2d``, a ``chainer.Sequential`` entry, a name imported
before ``convert``, a link that calls it), and on an array the guard has
not marked too, unless it holds whole images (after ``gather``): their
input is read as a tile, as spatial layers read theirs. They run with the
converted forward's ``overlap``.
"""
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import chainer

from .._marks import Flat, Tile, state
from ..operations._local import local_convolution_2d
from ..operations._norms import flat_layer_normalization, group_normalization
from ..operations._resize import resize_images
from ..operations._tower import flat_linear
from ..operations._windowed import (
    average_pooling_nd,
    convolution_nd,
    deconvolution_nd,
    max_pooling_nd,
    unpooling_nd,
)
from ..traffic._grid import SpatialGrid
from ._call import GATHER, Call, Refusal, Verdict

# A window function's spatial version on a node's inputs: (node, inputs, grid, overlap).
Window = Callable[[Any, Sequence[Any], SpatialGrid, bool], chainer.Variable]


def _pairs(node: Any, *names: str) -> Tuple[Tuple[int, int], ...]:
    """A 2-D node's attributes in pairs: ``_pairs(node, "sy", "sx")`` is ``((sy, sx),)``."""
    return tuple((getattr(node, a), getattr(node, b)) for a, b in zip(names[::2], names[1::2]))


def _params(inputs: Sequence[Any]) -> Tuple[Any, Any]:
    return inputs[1], inputs[2] if len(inputs) > 2 else None


def _convolution_2d(node: Any, inputs: Sequence[Any], grid: SpatialGrid,
                    overlap: bool) -> chainer.Variable:
    stride, pad, dilate = _pairs(node, "sy", "sx", "ph", "pw", "dy", "dx")
    return convolution_nd(inputs[0], *_params(inputs), stride, pad, node.cover_all, dilate,
                          node.groups, grid=grid, overlap=overlap)


def _convolution_nd(node: Any, inputs: Sequence[Any], grid: SpatialGrid,
                    overlap: bool) -> chainer.Variable:
    return convolution_nd(inputs[0], *_params(inputs), node.stride, node.pad, node.cover_all,
                          node.dilate, node.groups, grid=grid, overlap=overlap)


def _deconvolution_2d(node: Any, inputs: Sequence[Any], grid: SpatialGrid,
                      overlap: bool) -> chainer.Variable:
    stride, pad, dilate = _pairs(node, "sy", "sx", "ph", "pw", "dy", "dx")
    outsize = None if node.outh is None else (node.outh, node.outw)
    return deconvolution_nd(inputs[0], *_params(inputs), stride, pad, outsize, dilate,
                            node.groups, grid=grid, overlap=overlap)


def _deconvolution_nd(node: Any, inputs: Sequence[Any], grid: SpatialGrid,
                      overlap: bool) -> chainer.Variable:
    return deconvolution_nd(inputs[0], *_params(inputs), node.stride, node.pad, node.outs,
                            node.dilate, node.groups, grid=grid, overlap=overlap)


def _max_pooling(node: Any, inputs: Sequence[Any], grid: SpatialGrid,
                 overlap: bool) -> chainer.Variable:
    if node.return_indices:
        raise Refusal("return_indices gives indexes into this rank's tile, not the image",
                      GATHER)
    return max_pooling_nd(inputs[0], node.ksize, node.stride, node.pad, node.cover_all,
                          grid=grid, overlap=overlap)


def _average_pooling_2d(node: Any, inputs: Sequence[Any], grid: SpatialGrid,
                        overlap: bool) -> chainer.Variable:
    ksize, stride, pad = _pairs(node, "kh", "kw", "sy", "sx", "ph", "pw")
    return average_pooling_nd(inputs[0], ksize, stride, pad, 0, grid=grid, overlap=overlap)


def _average_pooling_nd(node: Any, inputs: Sequence[Any], grid: SpatialGrid,
                        overlap: bool) -> chainer.Variable:
    return average_pooling_nd(inputs[0], node.ksize, node.stride, node.pad, node.pad_value,
                              grid=grid, overlap=overlap)


def _unpooling(node: Any, inputs: Sequence[Any], grid: SpatialGrid,
               overlap: bool) -> chainer.Variable:
    if hasattr(node, "kh"):
        ksize, stride, pad = _pairs(node, "kh", "kw", "sy", "sx", "ph", "pw")
        outsize = None if node.outh is None else (node.outh, node.outw)
    else:
        ksize, stride, pad, outsize = node.ksize, node.stride, node.pad, node.outs
    return unpooling_nd(inputs[0], ksize, stride, pad, outsize, node.cover_all, grid=grid,
                        overlap=overlap)


# A window function's node (``_rules.key``), its spatial version and its name in errors.
WINDOWS: Dict[str, Tuple[Window, str]] = {
    "connection.convolution_2d.Convolution2DFunction": (_convolution_2d, "convolution"),
    "connection.convolution_nd.ConvolutionND": (_convolution_nd, "convolution"),
    "connection.deconvolution_2d.Deconvolution2DFunction": (_deconvolution_2d, "deconvolution"),
    "connection.deconvolution_nd.DeconvolutionND": (_deconvolution_nd, "deconvolution"),
    "pooling.max_pooling_nd.MaxPoolingND": (_max_pooling, "max pooling"),
    "pooling.average_pooling_2d.AveragePooling2D": (_average_pooling_2d, "average pooling"),
    "pooling.average_pooling_nd.AveragePoolingND": (_average_pooling_nd, "average pooling"),
    "pooling.unpooling_2d.Unpooling2D": (_unpooling, "unpooling"),
    "pooling.unpooling_nd.UnpoolingND": (_unpooling, "unpooling"),
}


def overlap() -> bool:
    """The running converted forward's ``overlap`` (True outside one)."""
    return state.scopes[-1].overlap if state.scopes else True


def window_rule(window: Window, what: str) -> Callable[[Call], Verdict]:
    """The rule of a window function (``what`` in errors) on a tile: its spatial version,
    on the tile's grid."""
    def rule(call: Call) -> Verdict:
        grid = _grid_of(_image(call, what))
        if call.first != 0:
            raise Refusal("a tile arrives as its weights", GATHER)
        return Verdict(convert=lambda: (window(call.node, call.inputs, grid, overlap()),))
    return rule


def _image(call: Call, what: str) -> Tile:
    tile = call.tile
    if tile.lead(call.ndim) != 2:
        raise Refusal(f"{what} needs (N, C, *spatial) tiles; this one has the split axes at "
                      f"{tile.split_axes(call.ndim)}", GATHER)
    return tile


def _grid_of(tile: Tile) -> SpatialGrid:
    grid = tile.grid
    assert isinstance(grid, SpatialGrid)  # a batch tile's node runs as it is (PER_SAMPLE)
    return grid


def resize_rule(call: Call) -> Verdict:
    grid = _grid_of(_image(call, "resize_images"))
    node = call.node

    def convert() -> Tuple[Any]:
        return (resize_images(call.x, (node.out_H, node.out_W), mode=node.mode,
                              align_corners=node.align_corners, grid=grid),)
    return Verdict(convert=convert)


def group_norm_rule(call: Call) -> Verdict:
    grid = _grid_of(_image(call, "group normalization"))
    x, gamma, beta = call.inputs

    def convert() -> Tuple[Any]:
        return (group_normalization(x, call.node.groups, gamma, beta, call.node.eps,
                                    grid=grid),)
    return Verdict(convert=convert)


def _flat(call: Call, what: str) -> Flat:
    if not isinstance(call.mark, Flat) or call.first != 0:
        raise Refusal(f"it receives {call.mark.describe()}{what}", GATHER)
    return call.mark


def layer_norm_rule(call: Call) -> Verdict:
    flat = _flat(call, "")
    x, gamma, beta = call.inputs

    def convert() -> Tuple[Any]:
        return (flat_layer_normalization(x, flat, gamma, beta, call.node.eps),)
    return Verdict(convert=convert)


def linear_rule(call: Call) -> Verdict:
    flat = _flat(call, " as weights")

    def convert() -> Tuple[Any]:
        return (flat_linear(call.inputs[0], flat, *call.inputs[1:]),)
    return Verdict(convert=convert)


def local_conv_rule(call: Call) -> Verdict:
    grid = _grid_of(_image(call, "local convolution"))
    if call.first != 0:
        raise Refusal("a tile arrives as its weights", GATHER)
    node = call.node

    def convert() -> Tuple[Any]:
        W, b = _params(call.inputs)
        return (local_convolution_2d(call.x, W, b, (node.sy, node.sx), grid=grid),)
    return Verdict(convert=convert)


def window_of(name: str) -> Optional[Window]:
    """The spatial version of the window function whose node is ``name`` (``_rules.key``)."""
    row = WINDOWS.get(name)
    return row[0] if row is not None else None
