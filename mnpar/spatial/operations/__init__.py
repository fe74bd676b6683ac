"""Spatial parallelism's operations: chainer's layers on tiles, built on the traffic.

The windowed functions and links (``_windowed``, ``_window_op``,
``_links``), normalizations (``_norms``), resizing (``_resize``), local
filtering (``_local``) and the tower (``_tower``), and the parameters cut by
pixel that the last two keep (``_shards``). Each computes the whole image's
result on tiles and marks its output; none imports the guard.
"""
