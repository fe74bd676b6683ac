"""``convert``: a chainer model's convolution, pooling and batch-norm layers made spatial.

Links are converted in place by class: each chainer link becomes its
spatial subclass (same parameters, names and initial values), so optimizer
state, snapshots and ``copyparams`` are untouched. Pooling is a function in
chainer, called from the model's own ``forward``; while a converted model
runs, the pooling and convolution functions of ``chainer.functions`` are the
spatial ones bound to the grid (and ``chainer.Sequential`` entries that name
them are replaced). A function imported under another name before the call
(``from chainer.functions import max_pooling_2d``) is not seen: call
``mnpar.spatial.max_pooling_2d(..., grid=grid)`` there.
"""
import contextlib
import functools
import threading
from typing import Any, Callable, Dict, Iterator

import chainer
import chainer.functions as F
import chainer.links as L

from . import _functions as S
from . import _state
from ._grid import SpatialGrid, require_grid
from ._links import (
    BatchNormalization,
    Convolution2D,
    ConvolutionND,
    Deconvolution2D,
    DeconvolutionND,
)

LINKS = {
    L.Convolution2D: Convolution2D,
    L.ConvolutionND: ConvolutionND,
    L.Deconvolution2D: Deconvolution2D,
    L.DeconvolutionND: DeconvolutionND,
    L.BatchNormalization: BatchNormalization,
}
FUNCTIONS = ("convolution_2d", "convolution_nd", "deconvolution_2d", "deconvolution_nd",
             "max_pooling_2d", "max_pooling_nd", "average_pooling_2d", "average_pooling_nd")
ORIGINAL: Dict[str, Callable[..., Any]] = {name: getattr(F, name) for name in FUNCTIONS}

_lock = threading.RLock()


def _spatial(name: str, grid: SpatialGrid, overlap: bool) -> Callable[..., Any]:
    spatial = functools.partial(getattr(S, name), grid=grid, overlap=overlap)
    original = ORIGINAL[name]

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        return (original if _state.gathered() else spatial)(*args, **kwargs)

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
def spatial_functions(grid: SpatialGrid, overlap: bool = True) -> Iterator[None]:
    """Within it, ``chainer.functions``' convolutions and pooling are the grid's,
    until ``gather`` makes the activations whole images again."""
    require_grid(grid, "spatial_functions")
    with _lock:
        saved = {name: getattr(F, name) for name in FUNCTIONS}
        gathered = _state.enter()
        for name in FUNCTIONS:
            setattr(F, name, _spatial(name, grid, overlap))
        try:
            yield
        finally:
            for name, fn in saved.items():
                setattr(F, name, fn)
            _state.leave(gathered)


def convert(model: chainer.Link, grid: SpatialGrid, overlap: bool = True) -> chainer.Link:
    """Makes ``model`` run on tiles of ``grid``: in place, and returns it.

    ``Convolution2D``, ``ConvolutionND``, ``Deconvolution2D``,
    ``DeconvolutionND`` and ``BatchNormalization`` links become their spatial
    versions; ``F.max_pooling_2d``, ``F.average_pooling_2d`` (``_nd`` too) and
    the convolution functions called in the model's ``forward`` run spatially.
    After a backward pass every rank's parameter gradients are the whole
    image's, so any chainer optimizer keeps the replicas equal.

    Layers that need whole images (``F.reshape`` before a fully connected
    layer, global pooling) need ``mnpar.spatial.gather`` first, and a loss over
    tiles needs ``sum_over_grid`` (or ``mnpar.spatial.mean_squared_error``).

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
        with spatial_functions(*self._spatial):
            return cls.forward(self, *args, **kwargs)

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:  # older models define __call__
        with spatial_functions(*self._spatial):
            return cls.__call__(self, *args, **kwargs)

    _CLASSES[cls] = type(cls.__name__, (cls,), {"forward": forward, "__call__": call,
                                                "_spatial_class": True,
                                                "__module__": cls.__module__,
                                                "__doc__": cls.__doc__})
    return _CLASSES[cls]
