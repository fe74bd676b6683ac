"""Datasets that give each rank only its tile of every image, and the whole label.

A spatial layer takes the tile ``grid.tile`` cuts from a global image, so
the data side cuts examples the same way, one at a time, as the iterator
reads them. ``TiledDataset`` wraps any dataset: it reads the whole example
and keeps the tile. ``TiledNpyDataset`` reads an ``.npy`` file of
``(N, C, *spatial)`` images through a memory map and indexes example ``i``'s
tile on the map in one step, ``images[i, :, rows, cols]``, then copies it
out; the copy touches only the pages that hold the tile's rows. The
operating system reads whole pages (4 KiB, plus its read-ahead), so what a
rank reads depends on the axis the grid splits::

    grid splits     pages one rank reads of a C x H x W example
    height (P, 1)   about 1/P: each channel's rows [r0, r1) are one run of bytes
    width (1, P)    every page that holds part of a row: the whole image
                    unless one row (W * itemsize bytes) spans several pages
    depth (P, 1, 1) about 1/P of a volume, as height for images

Sample groups (``grid.groups > 1``) are data parallel: each group takes other
examples and every rank of a group the same ones, so a dataset is split over
``grid.sample_comm`` (the ranks holding the same tile in every group) before
it is tiled. Split the indices, not the data, of a file every rank can open::

    in memory:  train = mnpar.scatter_dataset(train, grid.sample_comm, shuffle=True, seed=0)
                train = TiledDataset(train, grid)
    .npy file:  train = TiledNpyDataset("train.npy", grid, labels=labels)
                begin, end = mnpar.scatter_index(len(train), grid.sample_comm)
                order = np.random.RandomState(0).permutation(len(train))  # or None
                train = chainer.datasets.SubDataset(train, begin, end, order)

Every example read (in the main thread) leaves a fingerprint (its index, its
labels, its image's shape and a sample of its values; for the ``.npy``
dataset the index, shape and label): a converted model compares the last
batch's across the grid after its forward (``_checks``).

Shuffling has to agree across the ranks of a group. ``scatter_dataset``
needs a ``seed``: each tile position has its own ``sample_comm`` whose root
draws the permutation, and without a seed the tiles of one group would come
from different examples. The iterators of a group need one order too, e.g.
``mnpar.iterators.create_synchronized_iterator(it, grid.spatial_comm)``.
"""
import numbers
import os
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np
from chainer.dataset import DatasetMixin

from .._arrays import get_array_module, is_array
from .guard._checks import digest, record, sample
from .traffic._grid import SpatialGrid


def _positions(image: Any) -> Tuple[int, ...]:
    """``image`` as a tuple of distinct non-negative element indices."""
    items = (image,) if isinstance(image, numbers.Integral) else image
    try:
        raw = tuple(items)
    except TypeError:
        raw = ()
    if not raw or any(not isinstance(p, numbers.Integral) or isinstance(p, bool) for p in raw):
        raise TypeError(f"image must be an int or a non-empty tuple of ints (the positions "
                        f"of the images in each example), not {image!r}")
    positions = tuple(int(p) for p in raw)
    if any(p < 0 for p in positions) or len(set(positions)) < len(positions):
        raise ValueError(f"image={image!r} must name distinct non-negative positions in each "
                         "example, e.g. 0, or (0, 1) for an input and a target image")
    return positions


class TiledDataset(DatasetMixin):
    """A dataset whose examples hold this rank's tile of each image.

    Each example of ``dataset`` is an image array ``(C, *spatial)``, or a
    tuple whose elements at the positions ``image`` are such arrays; this
    dataset returns it with those images replaced by this rank's tile,
    ``x[(slice(None),) + grid.tile_slices(x.shape[1:])]`` as a contiguous
    array (a view of ``x`` where the tile already is contiguous, as
    ``grid.tile``), and every other element (labels) whole. Images may differ
    in size between examples; each is cut by the balanced rule.

    With several sample groups, split ``dataset`` over ``grid.sample_comm``
    first (see the module docstring).

    Args:
        dataset: any dataset (a list, a ``TupleDataset``, a
            ``DatasetMixin``...).
        grid: the spatial grid that tiles the images.
        image: the position of the image in each tuple example, or a tuple
            of positions, e.g. ``(0, 1)`` for an input and a target image
            (denoising, segmentation) that are both tiled. Examples that
            are bare arrays go with the default, 0.

    Raises:
        TypeError: ``image`` is not an int or a tuple of ints. On reading an
            example: an element at ``image`` that is not an array, or a bare
            array example while ``image`` names other positions.
        ValueError: ``image`` names a position twice or a negative one. On
            reading an example: a position beyond its tuple, or an image with
            fewer spatial axes or rows than the grid splits; the messages
            name the example's index.

    Example::

        grid = mnpar.spatial.SpatialGrid(comm, (1, 2))
        train = mnpar.spatial.TiledDataset(chainer.datasets.TupleDataset(x, t), grid)
        tile, label = train[0]   # tile == grid.tile(x[:1])[0], label == t[0]
    """

    def __init__(self, dataset: Any, grid: SpatialGrid, image: Union[int, Sequence[int]] = 0
                 ) -> None:
        if not isinstance(grid, SpatialGrid):
            raise TypeError(f"TiledDataset needs a SpatialGrid, not {type(grid).__name__}")
        self.dataset = dataset
        self.grid = grid
        self.image = _positions(image)

    def __len__(self) -> int:
        return len(self.dataset)

    def get_example(self, i: int) -> Any:
        example = self.dataset[i]
        record(self.grid, digest(i, *(sample(v) if p in self.image else v
                                      for p, v in enumerate(example if isinstance(example, tuple)
                                                            else (example,)))))
        if not isinstance(example, tuple):
            if self.image != (0,):
                raise TypeError(f"TiledDataset: example {i} is of type {type(example).__name__}, "
                                f"not a tuple with elements at image={self.image}")
            return self._tile(example, i, "")
        items = list(example)
        for p in self.image:
            if p >= len(items):
                raise ValueError(f"TiledDataset: example {i} has {len(items)} elements, so "
                                 f"none at position {p} of image={self.image}")
            items[p] = self._tile(items[p], i, f", element {p},")
        return tuple(items)

    def _tile(self, x: Any, i: int, where: str) -> Any:
        """This rank's tile of image ``x`` (``where`` names it in messages)."""
        if not is_array(x):
            raise TypeError(f"TiledDataset: example {i}{where} is of type {type(x).__name__}, "
                            "not an image array (C, *spatial)")
        try:
            index = (slice(None),) + self.grid.tile_slices(x.shape[1:])
        except ValueError as e:
            raise ValueError(f"TiledDataset: example {i}{where} of shape {x.shape}, read as "
                             f"(C, *spatial): {e}") from None
        return get_array_module(x).ascontiguousarray(x[index])


class TiledNpyDataset(DatasetMixin):
    """This rank's tiles of the images in an ``.npy`` file, read through a memory map.

    The file holds one array ``(N, C, *spatial)``; ``get_example(i)`` indexes
    the map once with example ``i``'s tile, ``images[(i, slice(None)) +
    tile_slices]``, and returns a new C-contiguous in-memory copy: only the
    pages that hold the tile are read (see the module docstring for what a
    width split reads), the map is never loaded whole, and no returned
    array keeps the file mapped.

    Compose ``TiledDataset`` with memory maps for more than one tiled array
    per example: ``TiledDataset(TupleDataset(np.load(a, mmap_mode="r"),
    np.load(b, mmap_mode="r")), grid, image=(0, 1))`` reads only the tiles
    too, but returns views of the maps where the tiles are contiguous.

    With several sample groups, split the indices over ``grid.sample_comm``
    (``scatter_index`` and ``SubDataset``; see the module docstring):
    ``scatter_dataset`` would load and send the images themselves.

    Args:
        path: the ``.npy`` file; every rank opens it.
        grid: the spatial grid that tiles the images.
        labels: None, or a sequence of ``N`` labels: examples are then
            ``(tile, labels[i])`` pairs instead of bare tiles.

    Attributes:
        images: the read-only memory map of the whole array.
        shape: its shape.

    Raises:
        ValueError: the file's array is not ``(N, C, *spatial)`` with at
            least the grid's spatial axes and as many rows as ranks along
            each; ``labels`` is not ``N`` long. ``np.load``'s errors for a
            file that is missing or cannot be mapped.
        TypeError: ``grid`` is not a ``SpatialGrid``; ``labels`` has no length.

    Example::

        grid = mnpar.spatial.SpatialGrid(comm, (2, 2))
        train = mnpar.spatial.TiledNpyDataset("images.npy", grid, labels=np.load("labels.npy"))
        tile, label = train[0]   # tile == grid.tile(images[:1])[0]
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], grid: SpatialGrid,
                 labels: Optional[Sequence[Any]] = None) -> None:
        if not isinstance(grid, SpatialGrid):
            raise TypeError(f"TiledNpyDataset needs a SpatialGrid, not {type(grid).__name__}")
        images = np.load(path, mmap_mode="r")
        if not isinstance(images, np.ndarray):
            raise ValueError(f"TiledNpyDataset: {os.fspath(path)!r} is not an .npy file of one "
                             f"array (np.load gave a {type(images).__name__})")
        if images.ndim < 2 + grid.ndim:
            raise ValueError(f"TiledNpyDataset: {os.fspath(path)!r} holds an array of shape "
                             f"{images.shape}, not (N, C, *spatial) with at least {grid.ndim} "
                             f"spatial axes (the grid {grid.shape} splits {grid.ndim})")
        try:
            slices = grid.tile_slices(images.shape[2:])
        except ValueError as e:
            raise ValueError(f"TiledNpyDataset: {os.fspath(path)!r} of shape {images.shape}: "
                             f"{e}") from None
        if labels is not None:
            try:
                n_labels = len(labels)
            except TypeError:
                raise TypeError(f"TiledNpyDataset: labels must be a sequence, not "
                                f"{type(labels).__name__}") from None
            if n_labels != len(images):
                raise ValueError(f"TiledNpyDataset: {n_labels} labels for the {len(images)} "
                                 f"images of {os.fspath(path)!r}; pass one label per image")
        self.path = path
        self.grid = grid
        self.images = images
        self.shape = images.shape
        self.labels = labels
        self._index = (slice(None),) + slices

    def __len__(self) -> int:
        return len(self.images)

    def get_example(self, i: int) -> Any:
        record(self.grid, digest(i, self.shape, None if self.labels is None else self.labels[i]))
        tile = np.array(self.images[(i,) + self._index], order="C")
        return tile if self.labels is None else (tile, self.labels[i])
