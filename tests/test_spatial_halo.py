"""halo_exchange: each tile extended by its neighbours' rows, and the halo's gradient back.

The forward is checked against one process: the whole image padded with
``fill`` by the halo on every axis of the grid, sliced around the rank's
tile (corners included, which reach a 2x2 grid's ranks through a
neighbour). The backward is checked as the forward's adjoint,
``<A x, y> == <x, A^T y>`` summed over the grid's ranks, for random ``x``
and ``y``. Verdicts are gathered over the grid before any assert, so every
rank fails alike and none is left in a collective.
"""
import math
import re
from typing import List, Tuple

import chainer
import numpy as np
import pytest

from mnpar.spatial import GeometryError, halo_exchange
from mnpar.spatial.traffic._geometry import halo_plan

IMAGE = (2, 3, 11, 9)
VOLUME = (2, 2, 5, 6, 9)

# grid shape, the global array, and halo forms: an int, one per grid axis, (lo, hi) pairs
HALOS_2D = [0, 1, 2, (1, 3), ((2, 0), (1, 2)), ((0, 0), (0, 3))]
HALOS_3D = [1, (0, 1, 2), ((1, 0), (0, 0), (2, 1))]
CASES = [
    pytest.param((1, 2), IMAGE, HALOS_2D, id="1x2", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((2, 1), IMAGE, HALOS_2D, id="2x1", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((1, 3), IMAGE, HALOS_2D, id="1x3", marks=pytest.mark.mpi(min_size=3)),
    pytest.param((3, 1), IMAGE, HALOS_2D, id="3x1", marks=pytest.mark.mpi(min_size=3)),
    pytest.param((2, 2), IMAGE, HALOS_2D, id="2x2", marks=pytest.mark.mpi(min_size=4)),
    pytest.param((1, 1, 2), VOLUME, HALOS_3D, id="1x1x2", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((2, 1, 1), VOLUME, HALOS_3D, id="2x1x1", marks=pytest.mark.mpi(min_size=2)),
]


def assert_agreed(grid, problems: List[str]) -> None:
    """Fails on every rank alike if any rank of the grid's communicator found a problem."""
    everyone = grid.comm.allreduce_obj([f"rank {grid.comm.rank} {p}" for p in problems])
    assert not everyone, "\n".join(everyone)


def widths(halo, ndim) -> List[Tuple[int, int]]:
    """``(lo, hi)`` per grid axis, as halo_exchange documents its argument."""
    items = [halo] * ndim if isinstance(halo, int) else list(halo)
    return [(h, h) if isinstance(h, int) else tuple(h) for h in items]


def expected_halo(grid, x, halo, fill):
    """The whole image padded with ``fill`` by the halo on the grid's axes, around the tile."""
    pads = widths(halo, grid.ndim)
    padded = np.pad(x, [(0, 0), (0, 0)] + pads + [(0, 0)] * (x.ndim - 2 - grid.ndim),
                    constant_values=fill)
    index = [slice(None), slice(None)]
    for axis, own in enumerate(grid.tile_slices(x.shape[2:])):
        lo, hi = pads[axis] if axis < grid.ndim else (0, 0)
        index.append(slice(own.start, own.stop + lo + hi))  # padded coordinates
    return padded[tuple(index)]


@pytest.mark.parametrize("fill", [0.0, 2.5, np.nan])
@pytest.mark.parametrize("shape, image, halos", CASES)
def test_the_halo_is_the_padded_images_slice_around_the_tile(grid, shape, image, halos, fill):
    x = np.random.RandomState(0).uniform(-1, 1, image)
    problems = []
    for halo, dtype in zip(halos, [np.float64, np.float32] * len(halos)):
        got = halo_exchange(grid.tile(x.astype(dtype)), grid, halo, fill)
        want = expected_halo(grid, x.astype(dtype), halo, fill)
        if got.dtype != dtype or got.shape != want.shape:
            problems.append(f"halo {halo}: {got.dtype}{got.shape}, want {dtype}{want.shape}")
        elif not np.array_equal(got.array, want, equal_nan=True):
            wrong = np.argwhere(~((got.array == want) | (np.isnan(got.array) & np.isnan(want))))
            problems.append(f"halo {halo}: {len(wrong)} values differ, the first at "
                            f"{tuple(wrong[0])}: {got.array[tuple(wrong[0])]} against "
                            f"{want[tuple(wrong[0])]}")
    assert_agreed(grid, problems)


@pytest.mark.mpi(min_size=4)
def test_a_2x2_grids_corners_come_from_the_diagonal_neighbour(grids):
    grid = grids((2, 2))
    x = np.arange(math.prod(IMAGE), dtype=np.float64).reshape(IMAGE)
    y = halo_exchange(grid.tile(x), grid, 2, fill=-1.0).array
    rows, cols = grid.tile_slices(IMAGE[2:])

    def inner(own, coord):
        """The two global rows past the tile's edge facing the centre, and where y holds them."""
        if coord == 0:
            return slice(own.stop, own.stop + 2), slice(-2, None)
        return slice(own.start - 2, own.start), slice(0, 2)

    (r, yr), (c, yc) = inner(rows, grid.coords[0]), inner(cols, grid.coords[1])
    problems = [] if np.array_equal(y[:, :, yr, yc], x[:, :, r, c]) else [
        f"corner {y[0, 0, yr, yc].tolist()}, want {x[0, 0, r, c].tolist()}"]
    assert_agreed(grid, problems)


@pytest.mark.parametrize("shape, image, halos", CASES)
def test_the_backward_is_the_forwards_adjoint(grid, shape, image, halos):
    rng = np.random.RandomState(3 + grid.rank)  # x and y differ from rank to rank
    problems = []
    for halo in halos:
        x = rng.standard_normal(grid.tile(np.empty(image)).shape)
        xv = chainer.Variable(x.copy())
        ax = halo_exchange(xv, grid, halo)
        y = rng.standard_normal(ax.shape)
        ax.grad = y.copy()
        ax.backward()
        # the fill is a constant: it adds nothing to the gradient
        xf = chainer.Variable(x.copy())
        af = halo_exchange(xf, grid, halo, fill=7.0)
        af.grad = y.copy()
        af.backward()
        lhs, rhs = grid.spatial_comm.allreduce_obj(
            np.array([np.vdot(ax.array, y), np.vdot(x, xv.grad)]))
        if not np.isclose(lhs, rhs, rtol=1e-12, atol=1e-12):
            problems.append(f"halo {halo}: <A x, y> = {lhs!r}, <x, A^T y> = {rhs!r}")
        if not np.array_equal(xf.grad, xv.grad):
            problems.append(f"halo {halo}: the gradient with fill 7 differs from fill 0's")
    assert_agreed(grid, problems)


# grid shape, spatial extent, halo: a halo wider than some neighbour's tile
TOO_WIDE = [
    pytest.param((1, 2), (6, 5), 3, id="1x2", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((2, 1), (3, 4), ((0, 3), (1, 1)), id="2x1-hi", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((1, 3), (4, 8), (0, (0, 3)), id="1x3-hi", marks=pytest.mark.mpi(min_size=3)),
    pytest.param((2, 2), (8, 8), (1, 5), id="2x2", marks=pytest.mark.mpi(min_size=4)),
]


@pytest.mark.parametrize("shape, spatial, halo", TOO_WIDE)
def test_a_halo_wider_than_a_neighbours_tile_raises_on_every_rank(grid, spatial, halo):
    x = grid.tile(np.zeros((1, 1) + spatial))
    problems = []
    try:
        halo_exchange(x, grid, halo)
        problems.append("no error")
    except GeometryError as error:
        if not isinstance(error, ValueError) or not re.search(
                r"halo of \d+ (rows|columns) is wider than rank \d+'s tile of \d+ \1.*"
                r"smallest extent that works is \d+", str(error)):
            problems.append(f"the message: {error}")
    except Exception as error:  # noqa: BLE001 - reported on every rank below
        problems.append(f"{type(error).__name__}: {error}")
    assert_agreed(grid, problems)
    assert grid.spatial_comm.allreduce_obj(1) == grid.size  # every rank goes on afterwards


def works(n, parts, lo, hi) -> bool:
    """Whether every rank of ``parts`` can take a halo ``(lo, hi)`` of ``n`` rows."""
    try:
        for r in range(parts):
            halo_plan(n, parts, r, lo, hi)
    except GeometryError:
        return False
    return True


@pytest.mark.parametrize("parts, n, lo, hi", [
    (2, 4, 3, 3),
    (3, 7, 3, 3),
    (2, 5, 0, 3),
    # regression: the suggestion was parts * max(lo, hi), 6 and 9 where 5 and 8 work
    # (only the ranks below the top one send lo rows: tiles 3, 2 and 3, 3, 2)
    (2, 4, 3, 0),
    (3, 6, 3, 1),
])
def test_the_suggested_extent_is_the_smallest_that_works(parts, n, lo, hi):
    with pytest.raises(GeometryError, match="smallest extent that works is") as error:
        halo_plan(n, parts, 0, lo, hi)
    suggested = int(re.search(r"smallest extent that works is (\d+)", str(error.value))[1])
    assert works(suggested, parts, lo, hi)
    assert not works(suggested - 1, parts, lo, hi), \
        f"{suggested - 1} rows work too: {str(error.value)}"


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("halo, message", [
    ((1,), r"halo \(1,\) must have one entry per split axis \(2\)"),
    ((1, 2, 3), r"halo \(1, 2, 3\) must have one entry per split axis \(2\)"),
    (-1, r"halo -1: each entry must be a non-negative int or a \(lo, hi\) pair"),
    ((1, (1, 2, 3)), r"halo \(1, \(1, 2, 3\)\): each entry .* \(lo, hi\) pair"),
    ((1, (2, -1)), r"halo \(1, \(2, -1\)\): each entry must be a non-negative int"),
    ((1, 1.5), r"halo \(1, 1\.5\): each entry must be a non-negative int .*, not 1\.5"),
    (1.5, r"halo 1\.5: each entry must be a non-negative int .*, not 1\.5"),
], ids=["too-few", "too-many", "negative", "triple", "negative-pair", "float-entry", "float"])
def test_a_malformed_halo_is_an_error_naming_it_on_every_rank(grids, halo, message):
    grid = grids((1, 1))
    x = grid.tile(np.zeros((1, 1, 4, 6)))
    problems = []
    try:
        halo_exchange(x, grid, halo)
        problems.append("no error")
    except (ValueError, TypeError) as error:
        if not re.search(message, str(error)):
            problems.append(f"{type(error).__name__}: {error}")
    assert_agreed(grid, problems)
