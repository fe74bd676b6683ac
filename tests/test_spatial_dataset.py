"""TiledDataset and TiledNpyDataset: each rank's tile of every example, and the whole label."""
import math

import chainer
import numpy as np
import pytest
from chainer.datasets import SubDataset, TupleDataset

import mnpar
from mnpar.spatial._dataset import TiledDataset, TiledNpyDataset

# Grid shapes and the (C, *spatial) examples they tile: odd sizes, so tiles differ.
GRIDS = [
    pytest.param((1, 1), (3, 31, 29), id="1x1", marks=pytest.mark.mpi(min_size=1)),
    pytest.param((1, 2), (3, 31, 29), id="1x2", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((2, 1), (3, 31, 29), id="2x1", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((2, 2), (3, 31, 29), id="2x2", marks=pytest.mark.mpi(min_size=4)),
    pytest.param((1, 1, 2), (2, 5, 6, 9), id="volume-1x1x2", marks=pytest.mark.mpi(min_size=2)),
]


def images(n, shape, dtype=np.float32):
    return np.arange(n * math.prod(shape), dtype=dtype).reshape((n,) + shape)


def assert_fresh_tile(tile, expected):
    assert type(tile) is np.ndarray
    assert tile.dtype == expected.dtype
    np.testing.assert_array_equal(tile, expected)
    assert tile.flags.c_contiguous


# -- TiledDataset ---------------------------------------------------------------


@pytest.mark.parametrize("shape, image", GRIDS)
def test_tuple_examples_give_the_tile_and_the_whole_label(grid, shape, image):
    x = images(5, image)
    t = np.arange(5, dtype=np.int32) * 10
    ds = TiledDataset(TupleDataset(x, t), grid)
    assert len(ds) == 5
    tiles = grid.tile(x)
    for i in range(5):
        tile, label = ds[i]
        assert_fresh_tile(tile, tiles[i])
        assert label == t[i]
    if grid.size > 1:
        assert tiles[0].shape != x[0].shape


@pytest.mark.parametrize("shape, image", GRIDS)
def test_input_and_target_images_are_both_tiled(grid, image):
    x = images(4, image)
    y = -images(4, image, np.float64)
    ds = TiledDataset([(x[i], "label", y[i]) for i in range(4)], grid, image=(0, 2))
    for i in range(4):
        xt, label, yt = ds[i]
        assert_fresh_tile(xt, grid.tile(x[i:i + 1])[0])
        assert_fresh_tile(yt, grid.tile(y[i:i + 1])[0])
        assert label == "label"


@pytest.mark.parametrize("shape, image", GRIDS)
def test_bare_array_examples_and_slices(grid, image):
    x = images(6, image)
    ds = TiledDataset(x, grid)
    tiles = grid.tile(x)
    got = ds[1:5]
    assert isinstance(got, list) and len(got) == 4
    for k, tile in enumerate(got):
        assert_fresh_tile(tile, tiles[1 + k])
    assert_fresh_tile(ds[-1], tiles[-1])


@pytest.mark.mpi(min_size=4)
def test_images_of_different_sizes_are_each_cut_by_their_own_size(grids):
    x = [images(1, (1, 31, 29))[0], images(1, (1, 16, 20))[0], images(1, (1, 2, 3))[0]]
    grid = grids((2, 2))
    ds = TiledDataset([(a, i) for i, a in enumerate(x)], grid)
    for i, a in enumerate(x):
        tile, label = ds[i]
        assert label == i
        assert_fresh_tile(tile, grid.tile(a[None])[0])
    assert ds[2][0].shape == [(1, 1, 2), (1, 1, 1), (1, 1, 2), (1, 1, 1)][grid.rank]


@pytest.mark.mpi(min_size=2)
def test_tiles_of_a_group_make_up_the_image(grids):
    x = images(3, (3, 31, 29))
    grid = grids((1, 2))
    ds = TiledDataset(TupleDataset(x, np.arange(3)), grid)
    for i in range(3):
        left, right = grid.spatial_comm.allgather_obj(ds[i][0])
        assert left.shape == (3, 31, 15) and right.shape == (3, 31, 14)
        np.testing.assert_array_equal(np.concatenate([left, right], axis=2), x[i])


@pytest.mark.parametrize("image, error, match", [
    ("0", TypeError, "image must be an int or a non-empty tuple of ints"),
    ((), TypeError, "image must be an int or a non-empty tuple of ints"),
    (True, TypeError, "image must be an int or a non-empty tuple of ints"),
    ((0, 1.0), TypeError, "image must be an int or a non-empty tuple of ints"),
    ((0, 0), ValueError, r"image=\(0, 0\) must name distinct non-negative positions"),
    (-1, ValueError, "image=-1 must name distinct non-negative positions"),
])
@pytest.mark.mpi(min_size=1)
def test_bad_image_positions(grids, image, error, match):
    grid = grids((1, 1))
    with pytest.raises(error, match=match):
        TiledDataset([], grid, image=image)


@pytest.mark.mpi(min_size=1)
def test_bad_examples_name_their_index(grids):
    good = images(1, (3, 8, 8))[0]
    grid = grids((1, 1))
    with pytest.raises(TypeError, match="TiledDataset needs a SpatialGrid, not tuple"):
        TiledDataset([], (1, 1))
    ds = TiledDataset([(good, 0), ([[1.0]], 1), (np.zeros((3, 8)), 2), (good,)], grid)
    ds[0]
    with pytest.raises(TypeError, match=r"example 1, element 0, is of type list, not an "
                                        r"image array \(C, \*spatial\)"):
        ds[1]
    with pytest.raises(ValueError, match=r"example 2, element 0, of shape \(3, 8\), read as "
                                         r"\(C, \*spatial\): an image with spatial shape "
                                         r"\(8,\) has fewer axes than the grid \(1, 1\)"):
        ds[2]
    with pytest.raises(ValueError, match=r"example 3 has 1 elements, so none at position 1 "
                                         r"of image=\(0, 1\)"):
        TiledDataset(ds.dataset, grid, image=(0, 1))[3]
    with pytest.raises(TypeError, match=r"example 0 is of type ndarray, not a tuple "
                                        r"with elements at image=\(0, 1\)"):
        TiledDataset([good], grid, image=(0, 1))[0]
    with pytest.raises(ValueError, match=r"example 0 of shape \(3,\), read as"):
        TiledDataset(np.zeros((2, 3)), grid)[0]


@pytest.mark.mpi(min_size=2)
def test_an_image_narrower_than_the_grid(grids):
    grid = grids((1, 2))
    ds = TiledDataset([np.zeros((3, 4, 2)), np.zeros((3, 4, 1))], grid)
    ds[0]
    with pytest.raises(ValueError, match=r"example 1 of shape \(3, 4, 1\).*spatial axis 1 "
                                         "has 1 rows, fewer than the grid's 2 ranks"):
        ds[1]


# -- TiledNpyDataset ------------------------------------------------------------


class RecordingArray:
    """Stands in for the memory map and records every index taken of it."""

    def __init__(self, array):
        self.array = array
        self.keys = []

    def __len__(self):
        return len(self.array)

    def __getitem__(self, key):
        self.keys.append(key)
        return self.array[key]


@pytest.mark.parametrize("shape, image", GRIDS)
def test_npy_tiles_equal_grid_tile(grid, tmp_path, shape, image):
    x = images(4, image)
    np.save(tmp_path / "x.npy", x)
    ds = TiledNpyDataset(tmp_path / "x.npy", grid)
    labelled = TiledNpyDataset(str(tmp_path / "x.npy"), grid, labels=["a", "b", "c", "d"])
    assert len(ds) == len(labelled) == 4
    tiles = grid.tile(x)
    for i in range(4):
        assert_fresh_tile(ds[i], tiles[i])
        tile, label = labelled[i]
        assert_fresh_tile(tile, tiles[i])
        assert label == "abcd"[i]
    assert [t.shape for t in ds[1:3]] == [tiles[1].shape] * 2


# With one channel and a grid (2, 1) a tile is one run of bytes in the file, so
# a contiguous view of the map would pass for a tile; it must be a copy anyway.
@pytest.mark.parametrize("shape, image", GRIDS + [
    pytest.param((2, 1), (1, 31, 29), id="2x1-one-channel", marks=pytest.mark.mpi(min_size=2)),
])
def test_npy_reads_only_the_tile_of_a_memory_map(grid, tmp_path, shape, image):
    # What is checked: the images stay a memory map (never loaded); example
    # i is one index of the map that selects exactly the tile's elements,
    # (i, all channels, tile slices); and the result is an in-memory copy
    # that shares no memory with the map. Not measured: the pages the
    # operating system reads, which depend on the page size and read-ahead.
    x = images(3, image)
    np.save(tmp_path / "x.npy", x)
    ds = TiledNpyDataset(tmp_path / "x.npy", grid)
    assert isinstance(ds.images, np.memmap) and ds.images.shape == x.shape
    mapped = ds.images
    tile = ds[1]
    assert type(tile) is np.ndarray and tile.flags.owndata
    assert not np.shares_memory(tile, mapped)
    ds.images = RecordingArray(mapped)
    tile = ds[2]
    assert len(ds.images.keys) == 1
    key = ds.images.keys[0]
    assert key[:2] == (2, slice(None))
    assert all(isinstance(k, slice) and k.step is None for k in key[1:])
    assert mapped[key].size == tile.size == grid.tile(x)[2].size
    assert_fresh_tile(tile, grid.tile(x)[2])


@pytest.mark.mpi(min_size=2)
def test_npy_errors(mcomm, grids, tmp_path):
    np.save(tmp_path / "flat.npy", np.zeros((4, 8, 8)))
    np.save(tmp_path / "narrow.npy", np.zeros((4, 1, 8, 1)))
    np.save(tmp_path / "ok.npy", np.zeros((4, 1, 8, 8)))
    np.savez(tmp_path / "two.npz", a=np.zeros(3), b=np.zeros(3))
    grid = grids((1, 2))
    with pytest.raises(ValueError, match=r"flat.npy' holds an array of shape \(4, 8, 8\), "
                                         r"not \(N, C, \*spatial\) with at least 2 spatial"):
        TiledNpyDataset(tmp_path / "flat.npy", grid)
    with pytest.raises(ValueError, match=r"narrow.npy' of shape \(4, 1, 8, 1\): spatial "
                                         "axis 1 has 1 rows"):
        TiledNpyDataset(tmp_path / "narrow.npy", grid)
    with pytest.raises(ValueError, match="two.npz' is not an .npy file of one array"):
        TiledNpyDataset(tmp_path / "two.npz", grid)
    with pytest.raises(ValueError, match="3 labels for the 4 images of"):
        TiledNpyDataset(tmp_path / "ok.npy", grid, labels=[0, 1, 2])
    with pytest.raises(TypeError, match="labels must be a sequence, not int"):
        TiledNpyDataset(tmp_path / "ok.npy", grid, labels=4)
    with pytest.raises(TypeError, match="TiledNpyDataset needs a SpatialGrid"):
        TiledNpyDataset(tmp_path / "ok.npy", mcomm)
    with pytest.raises(FileNotFoundError):
        TiledNpyDataset(tmp_path / "missing.npy", grid)


# -- sample groups ----------------------------------------------------------------


def check_groups(grid, ds, x, n):
    """Each group holds other examples, all ranks of a group the same ones, tiled."""
    labels = [int(ds[k][1]) for k in range(len(ds))]
    assert len(labels) == n // grid.groups
    assert grid.spatial_comm.allgather_obj(labels) == [labels] * grid.size
    groups = grid.sample_comm.allgather_obj(labels)
    assert sorted(sum(groups, [])) == list(range(n))
    for k, i in enumerate(labels):
        assert_fresh_tile(ds[k][0], grid.tile(x[i:i + 1])[0])


@pytest.mark.mpi(min_size=4)
def test_scatter_over_sample_groups_then_tile(mcomm, grids):
    n = 10
    x = images(n, (3, 31, 29))
    grid = grids((1, 2))
    assert grid.groups == mcomm.size // 2
    n = n - n % grid.groups
    scattered = mnpar.scatter_dataset(TupleDataset(x[:n], np.arange(n)), grid.sample_comm,
                                      shuffle=True, seed=3)
    ds = TiledDataset(scattered, grid)
    check_groups(grid, ds, x, n)
    assert [int(ds[k][1]) for k in range(len(ds))] != list(range(len(ds)))  # shuffled

    it = mnpar.iterators.create_synchronized_iterator(
        chainer.iterators.SerialIterator(ds, 2), grid.spatial_comm)
    for _ in range(len(ds)):  # two epochs of batches of 2
        batch = [int(label) for _, label in it.next()]
        assert grid.spatial_comm.allgather_obj(batch) == [batch] * grid.size


@pytest.mark.mpi(min_size=4)
def test_npy_indices_over_sample_groups(grids, tmp_path):
    n = 12
    x = images(n, (2, 31, 29))
    np.save(tmp_path / "x.npy", x)
    grid = grids((1, 2))
    n = n - n % grid.groups
    ds = TiledNpyDataset(tmp_path / "x.npy", grid, labels=np.arange(len(x)))
    begin, end = mnpar.scatter_index(n, grid.sample_comm)
    order = np.random.RandomState(5).permutation(n)
    check_groups(grid, SubDataset(ds, begin, end, order), x, n)
