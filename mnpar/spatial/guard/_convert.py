"""``convert``: a chainer model made to run on tiles, under the guard.

Links are converted in place by class: each chainer link with a spatial
version becomes its spatial subclass (same parameters, names and initial
values), so optimizer state, snapshots and ``copyparams`` are untouched.
The functions the model's own ``forward`` calls (convolutions, pooling and
everything else) are the guard's: it converts, lets run or refuses each
node chainer applies (``_guard``), however the function was reached.

A converted forward runs inside ``running``::

    mark the arguments that are tiles (one allgather each: the tiles checked)
    the guard on: every chainer function on a tile is exact, converted or
        refused (``_guard``)
    the forward
    one allgather of fingerprints: replicas and data the same on every rank
        (``_checks``)
"""
import contextlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import chainer
import chainer.links as L

from ..._arrays import is_array
from .._marks import Tile, mark, mark_of, state
from ..operations._links import (
    BatchNormalization,
    Convolution2D,
    ConvolutionND,
    Deconvolution2D,
    DeconvolutionND,
)
from ..operations._local import LocalConvolution2D
from ..operations._shards import Replicas, replicas
from ..operations._tower import Linear
from ..traffic._grid import SpatialGrid, require_grid
from . import _checks, _guard

LINKS = {
    L.Convolution2D: Convolution2D,
    L.ConvolutionND: ConvolutionND,
    L.Deconvolution2D: Deconvolution2D,
    L.DeconvolutionND: DeconvolutionND,
    L.BatchNormalization: BatchNormalization,
    L.Linear: Linear,
    L.LocalConvolution2D: LocalConvolution2D,
}


@contextlib.contextmanager
def spatial_functions(grid: SpatialGrid, overlap: bool = True,
                      root: Optional[chainer.Link] = None) -> Iterator[None]:
    """Within it, chainer's functions that receive a tile of ``grid`` are exact, converted
    or refused: its convolutions and pooling are the grid's (on tiles, and on any array
    not known to hold whole images; chainer's own after ``gather``), every other function
    is checked by the guard (``root``: the model whose layers errors name)."""
    require_grid(grid, "spatial_functions")
    with _guard.guarded(grid, root, overlap):
        yield


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

    def mnpar_replicas(self: Any) -> Replicas:  # gradient clipping counts each once
        return replicas(self._spatial[0], self.params())

    _CLASSES[cls] = type(cls.__name__, (cls,), {"forward": forward, "__call__": call,
                                                "mnpar_replicas": mnpar_replicas,
                                                "_spatial_class": True,
                                                "__module__": cls.__module__,
                                                "__doc__": cls.__doc__})
    return _CLASSES[cls]
