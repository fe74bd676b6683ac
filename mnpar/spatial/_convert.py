"""``convert``: a chainer model made to run on tiles, under the guard.

Links are converted in place by class: each chainer link with a spatial
version becomes its spatial subclass (same parameters, names and initial
values), so optimizer state, snapshots and ``copyparams`` are untouched.
Pooling and convolution are functions in chainer, called from the model's
own ``forward``; while a converted model runs, those of
``chainer.functions`` are the spatial ones bound to the grid (and
``chainer.Sequential`` entries that name them are replaced).

A converted forward runs inside ``running``::

    mark the arguments that are tiles (one allgather each: the tiles checked)
    the guard on: every other chainer function on a tile is exact, converted
        or refused (``_guard``)
    the forward
    one allgather of fingerprints: replicas and data the same on every rank
        (``_checks``)
"""
import contextlib
import functools
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import chainer
import chainer.functions as F
import chainer.links as L

from .._arrays import is_array
from . import _checks, _guard, _state
from . import _functions as S
from ._errors import SpatialError
from ._grid import SpatialGrid, require_grid
from ._links import (
    BatchNormalization,
    Convolution2D,
    ConvolutionND,
    Deconvolution2D,
    DeconvolutionND,
)
from ._local import LocalConvolution2D
from ._marks import Tile, mark, mark_of, state, whole_image
from ._shards import replicas
from ._tower import Linear

LINKS = {
    L.Convolution2D: Convolution2D,
    L.ConvolutionND: ConvolutionND,
    L.Deconvolution2D: Deconvolution2D,
    L.DeconvolutionND: DeconvolutionND,
    L.BatchNormalization: BatchNormalization,
    L.Linear: Linear,
    L.LocalConvolution2D: LocalConvolution2D,
}
FUNCTIONS = ("convolution_2d", "convolution_nd", "deconvolution_2d", "deconvolution_nd",
             "max_pooling_2d", "max_pooling_nd", "average_pooling_2d", "average_pooling_nd",
             "convolution_1d", "convolution_3d", "deconvolution_1d", "deconvolution_3d",
             "max_pooling_1d", "max_pooling_3d", "average_pooling_1d", "average_pooling_3d",
             "dilated_convolution_2d")
ORIGINAL: Dict[str, Callable[..., Any]] = {name: getattr(F, name) for name in FUNCTIONS}
_AVERAGE = F.average
# chainer functions that compute on raw arrays of a tile (out of the guard's sight)
RAW = {"discriminative_margin_based_clustering_loss":
       "it counts the labels' pixels with numpy, on this rank's tile only"}
_RAW_ORIGINAL = {name: getattr(F, name) for name in RAW}


def _refusing(name: str) -> Callable[..., Any]:
    original = _RAW_ORIGINAL[name]

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if any(isinstance(mark_of(a), Tile) for a in list(args) + list(kwargs.values())):
            raise SpatialError(f"F.{name} in {_guard.layer()} cannot run on tiles of the "
                               f"spatial grid: {RAW[name]}; call mnpar.spatial.gather(h, grid) "
                               "first")
        return original(*args, **kwargs)
    return call


def _average(x: Any, axis: Any = None, weights: Any = None, keepdims: bool = False) -> Any:
    """``F.average`` (``F.mean``): weights along a split axis are refused, the rest is
    chainer's (its mean over split axes is converted by the guard)."""
    m = mark_of(x)
    if weights is not None and isinstance(m, Tile):
        ndim = len(x.shape)
        axes = range(ndim) if axis is None else \
            [a % ndim for a in (axis if isinstance(axis, tuple) else (axis,))]
        if set(axes) & set(m.split_axes(ndim)):
            raise SpatialError(f"F.average with weights in {_guard.layer()} cannot run on tiles "
                               f"of the spatial grid: the weights run along split axis "
                               f"{sorted(set(axes) & set(m.split_axes(ndim)))}; weigh the tile "
                               "first (h * w_tile, w_tile = grid.tile of the weights) and take "
                               "F.sum, or call mnpar.spatial.gather(h, grid) first")
    return _AVERAGE(x, axis, weights, keepdims)

_lock = threading.RLock()


def _spatial(name: str, grid: SpatialGrid, overlap: bool) -> Callable[..., Any]:
    spatial = functools.partial(getattr(S, name), grid=grid, overlap=overlap)
    original = ORIGINAL[name]

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        x = args[0] if args else kwargs.get("x")
        return (original if whole_image(x) else spatial)(*args, **kwargs)

    return call


def _swap(fn: Any, grid: SpatialGrid, overlap: bool) -> Any:
    """A Sequential entry's spatial counterpart, or the entry itself."""
    for name, original in ORIGINAL.items():
        if fn is original:
            return _spatial(name, grid, overlap)
        if isinstance(fn, functools.partial) and fn.func is original:
            return functools.partial(_spatial(name, grid, overlap), *fn.args, **fn.keywords)
    return fn


@contextlib.contextmanager
def spatial_functions(grid: SpatialGrid, overlap: bool = True,
                      root: Optional[chainer.Link] = None) -> Iterator[None]:
    """Within it, ``chainer.functions``' convolutions and pooling are the grid's (on
    tiles; chainer's own on whole images, after ``gather``), and the guard checks every
    other function that receives a tile (``root``: the model whose layers errors name)."""
    require_grid(grid, "spatial_functions")
    with _lock:
        saved = {name: getattr(F, name) for name in FUNCTIONS + ("average", "mean") + tuple(RAW)}
        gathered = _state.enter()
        for name in FUNCTIONS:
            setattr(F, name, _spatial(name, grid, overlap))
        F.average = F.mean = _average
        for name in RAW:
            setattr(F, name, _refusing(name))
        try:
            with _guard.guarded(grid, root):
                yield
        finally:
            for name, fn in saved.items():
                setattr(F, name, fn)
            _state.leave(gathered)


def _arrays(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Any]:
    return [v for v in list(args) + [kwargs[k] for k in sorted(kwargs)]
            if isinstance(v, chainer.Variable) or is_array(v)]


@contextlib.contextmanager
def running(model: chainer.Link, args: Tuple[Any, ...], kwargs: Dict[str, Any]
            ) -> Iterator[None]:
    """A converted forward: its tiles marked, the guard on, the replicas and data checked
    at the end (the outermost converted forward only)."""
    grid, overlap = model._spatial
    outer = not state.scopes
    with spatial_functions(grid, overlap, model):
        others, batch = [], 0
        for x in _arrays(args, kwargs):
            if mark_of(x) is not None:
                continue
            if len(x.shape) >= 2 + grid.ndim:
                shape = grid.global_shape(x.shape, f"the input of {type(model).__name__}")
                mark(x, Tile(grid, shape[2:2 + grid.ndim], len(shape) - 2 - grid.ndim))
                batch = batch or int(shape[0])
            else:
                others.append(x)
        yield
        if outer:
            _checks.check(grid, model, others, batch)


def convert(model: chainer.Link, grid: SpatialGrid, overlap: bool = True) -> chainer.Link:
    """Makes ``model`` run on tiles of ``grid``: in place, and returns it.

    ``Convolution2D``, ``ConvolutionND``, ``Deconvolution2D``,
    ``DeconvolutionND``, ``BatchNormalization``, ``LocalConvolution2D`` and
    ``Linear`` links become their spatial versions (the last two keep only
    this rank's part of their weights); the convolution and pooling functions
    called in the model's ``forward`` run spatially. Every other chainer
    function that receives a tile there is exact as it is, converted
    (reductions over the split axes, padding, slicing, resizing,
    normalizations across pixels) or refused with a ``SpatialError`` on every
    rank; parameters that meet tiles get the whole image's gradient. After a
    backward pass every rank's gradients are the whole image's, so any
    chainer optimizer keeps the replicas equal. The first forward checks that
    every rank of the grid holds the same parameters, and every forward that
    the ranks' data are tiles of the same images.

    A loss over the output tiles, computed outside the model, needs
    ``sum_over_grid`` (or ``mnpar.spatial.mean_squared_error``); layers that
    need the whole image itself come after ``mnpar.spatial.gather``.

    Raises:
        TypeError: ``grid`` is not a SpatialGrid.
        ValueError: a batch normalization link with a custom ``axis``.
    """
    require_grid(grid, "convert")
    for link in model.links():
        spatial = LINKS.get(type(link))
        if spatial is BatchNormalization and link.axis is not None:
            raise ValueError(f"convert: batch normalization {link.name!r} has axis="
                             f"{link.axis!r}; spatial batch normalization needs the default")
        if spatial is not None:
            link.__class__ = spatial
            link._on_grid(grid, overlap)
        if isinstance(link, chainer.Sequential):
            link._layers = [_swap(fn, grid, overlap) for fn in link._layers]
    model.__class__ = _runs_spatially(type(model))
    model._spatial = (grid, overlap)
    return model


_CLASSES: Dict[type, type] = {}


def _runs_spatially(cls: Any) -> type:
    """``cls`` with a ``forward`` that runs inside ``spatial_functions`` (one per class)."""
    if getattr(cls, "_spatial_class", False):
        return cls
    if cls in _CLASSES:
        return _CLASSES[cls]

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        with running(self, args, kwargs):
            return cls.forward(self, *args, **kwargs)

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:  # older models define __call__
        with running(self, args, kwargs):
            return cls.__call__(self, *args, **kwargs)

    def mnpar_replicas(self: Any) -> Any:  # gradient clipping counts each once
        return replicas(self._spatial[0], self)

    _CLASSES[cls] = type(cls.__name__, (cls,), {"forward": forward, "__call__": call,
                                                "mnpar_replicas": mnpar_replicas,
                                                "_spatial_class": True,
                                                "__module__": cls.__module__,
                                                "__doc__": cls.__doc__})
    return _CLASSES[cls]
