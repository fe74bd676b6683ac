"""Where a tile's split axes go through chainer's axis functions: pure functions, no MPI."""
import numpy as np
import pytest

from mnpar.spatial._marks import Flat, Tile
from mnpar.spatial.guard._call import Refusal
from mnpar.spatial.guard._layout import (
    concat_axis,
    inserted,
    norm_axes,
    permutation,
    permuted,
    reduced,
    removed,
    reshaped,
    resolve,
)


class Grid:
    """A stand-in for a SpatialGrid: its shape and this rank's tile slices."""

    shape = (2, 2)
    ndim = 2

    def tile_slices(self, extents):
        return tuple(slice(0, (n + 1) // 2) for n in extents)


GRID = Grid()
TILE = Tile(GRID, (9, 11), 0)  # (N, C, 9, 11) on a 2x2 grid


def test_a_tiles_split_axes_are_found_from_the_end():
    assert TILE.split_axes(4) == (2, 3) and TILE.lead(4) == 2
    assert Tile(GRID, (9, 11), 1).split_axes(5) == (2, 3)
    assert TILE.local() == (5, 6)
    assert TILE.global_shape((2, 4, 5, 6)) == (2, 4, 9, 11)


def test_reductions_keep_or_move_the_split_axes():
    assert norm_axes(None, 3) == (0, 1, 2) and norm_axes((-1, 0), 4) == (0, 3)
    assert reduced(TILE, 4, (1,), False) == Tile(GRID, (9, 11), 0)
    assert reduced(Tile(GRID, (9, 11), 1), 5, (4,), False) == Tile(GRID, (9, 11), 0)
    assert reduced(TILE, 4, (0, 1), True) == TILE


def test_permutations_that_keep_the_split_axes_in_order_are_exact():
    assert permutation(lambda a: np.moveaxis(a, 0, 1), 4) == (1, 0, 2, 3)
    assert permuted(TILE, (1, 0, 2, 3), "it") == TILE
    with pytest.raises(Refusal, match=r"it separates the split axes \(they land at \(3, 2\)\)"):
        permuted(TILE, (0, 1, 3, 2), "it")
    with pytest.raises(Refusal, match="separates the split axes"):
        permuted(TILE, (2, 0, 1, 3), "it")


def test_new_and_dropped_axes():
    assert inserted(TILE, 4, 0, "it") == TILE
    assert inserted(TILE, 4, 4, "it") == Tile(GRID, (9, 11), 1)
    with pytest.raises(Refusal, match="separates"):
        inserted(TILE, 4, 3, "it")
    assert removed(Tile(GRID, (9, 11), 1), 5, (4,), "it") == TILE
    with pytest.raises(Refusal, match="it drops split axis 2"):
        removed(TILE, 4, (2,), "it")


def test_reshapes_of_the_leading_axes_and_the_flattened_tile():
    assert resolve((2, 4, 5, 6), (2, -1)) == (2, 120)
    assert reshaped(TILE, (2, 4, 5, 6), (2, 2, 2, 5, 6)) == TILE
    flat = reshaped(TILE, (2, 4, 5, 6), (2, -1))
    assert flat == Flat(GRID, (4, 9, 11), 1)
    assert flat.local_block() == (4, 5, 6)
    features = flat.features()
    assert len(features) == 4 * 5 * 6 and features[:3].tolist() == [0, 1, 2]
    assert features[6] == 11  # the tile's second row starts a whole row later
    with pytest.raises(Refusal, match=r"reshapes a tile of shape \(2, 4, 5, 6\) to \(2, 4, 30\)"):
        reshaped(TILE, (2, 4, 5, 6), (2, 4, -1))


def test_a_concatenation_along_a_split_axis_is_refused():
    assert concat_axis(TILE, 4, 1, "it") == TILE
    with pytest.raises(Refusal, match="it along split axis 3, on tiles rather than images"):
        concat_axis(TILE, 4, -1, "it")
