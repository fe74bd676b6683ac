"""Spatial parallelism: images and volumes cut into tiles across ranks.

See docs/spatial.rst. ``SpatialGrid`` lays ranks over the spatial axes,
``halo_exchange`` brings each tile the rows its neighbours hold, and the
layers here are chainer's own with the grid added.
"""
from ._geometry import GeometryError
from ._grid import SpatialGrid
from ._halo import halo_exchange

__all__ = ["GeometryError", "SpatialGrid", "halo_exchange"]
