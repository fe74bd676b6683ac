"""Spatial parallelism's traffic: what moves between the ranks of a grid.

The grid and its collectives (``_grid``: ``SpatialGrid``, the tiles' shapes,
sums, one ``wait`` for them all), the window arithmetic as pure functions
(``_geometry``), halos (``_halo``), rows moved along a split axis
(``_rows``), reductions over the grid (``_reduce``, ``_sums``, ``_whole``)
and batch shares (``_batch``). It imports neither the operations nor the
guard; docs/internals.rst has the map.
"""
