"""SpatialGrid, and from tiles back to whole images: gather, sum_over_grid, mean_squared_error.

Transparency: every rank draws the whole images from one seed and compares
what it gets from its tile with chainer in one process on the whole image.
After ``gather`` or ``sum_over_grid`` every rank runs the same (replicated)
computation, so each rank's tile gradient must be its tile of the
one-process gradient, not the grid's size times it. Verdicts are gathered
over the grid before any assert, so every rank fails alike and none is left
in a collective.
"""
import math
import re
from typing import Any, List, Optional

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import mnpar
from mnpar.spatial import SpatialGrid, gather, mean_squared_error, sum_over_grid

IMAGE = (2, 3, 31, 29)
VOLUME = (2, 2, 5, 6, 9)
TOL = {np.float32: 1e-6, np.float64: 1e-12}

GRIDS = [
    pytest.param((1, 2), IMAGE, id="1x2", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((2, 1), IMAGE, id="2x1", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((1, 3), IMAGE, id="1x3", marks=pytest.mark.mpi(min_size=3)),
    pytest.param((3, 1), IMAGE, id="3x1", marks=pytest.mark.mpi(min_size=3)),
    pytest.param((2, 2), IMAGE, id="2x2", marks=pytest.mark.mpi(min_size=4)),
    pytest.param((1, 1, 2), VOLUME, id="1x1x2", marks=pytest.mark.mpi(min_size=2)),
]
DTYPES = [np.float32, np.float64]


def free(grid):
    grid.mpi.Free()
    grid.spatial_comm.finalize()
    grid.sample_comm.finalize()


def difference(name: str, got: Any, want: Any, dtype: Any) -> Optional[str]:
    """Why ``got`` is not ``want`` to ``dtype``'s tolerance, or None."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{name}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
    try:
        np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype], err_msg=name)
    except AssertionError as error:
        return str(error)
    return None


def assert_agreed(grid, problems: List[Optional[str]]) -> None:
    """Fails on every rank alike if any rank of the grid's communicator found a problem."""
    mine = [f"rank {grid.comm.rank} {p}" for p in problems if p]
    everyone = grid.comm.allreduce_obj(mine)
    assert not everyone, "\n".join(everyone)


# -- gather -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, image", GRIDS)
def test_gather_gives_every_rank_the_whole_image_and_its_tiles_gradient(grid,
                                                                        image, dtype):
    rng = np.random.RandomState(1)
    x = rng.uniform(-1, 1, image).astype(dtype)
    w = rng.uniform(-1, 1, image).astype(dtype)
    xv = chainer.Variable(x.copy())
    F.sum(F.tanh(xv) * w).backward()

    xt = chainer.Variable(grid.tile(x))
    whole = gather(xt, grid)
    F.sum(F.tanh(whole) * w).backward()  # the same replicated computation on every rank
    assert_agreed(grid, [difference("whole", whole.array, x, dtype),
                         difference("x.grad", xt.grad, grid.tile(xv.grad), dtype)])


@pytest.mark.parametrize("shape", [
    pytest.param((1, 2), marks=pytest.mark.mpi(min_size=2)),
    pytest.param((2, 2), marks=pytest.mark.mpi(min_size=4)),
])
def test_a_spatial_convolution_gather_and_linear_train_as_one_process(grid):
    rng = np.random.RandomState(2)
    x = rng.uniform(-1, 1, (2, 3, 11, 9))
    t = np.array([1, 3], np.int32)
    with chainer.using_config("dtype", np.float64):
        np.random.seed(0)
        conv, fc = L.Convolution2D(3, 4, 3, stride=2, pad=1), L.Linear(4 * 6 * 5, 5)
    spatial_conv, spatial_fc = conv.copy("copy"), fc.copy("copy")
    F.softmax_cross_entropy(fc(F.relu(conv(x))), t).backward()

    h = mnpar.spatial.convolution_2d(grid.tile(x), spatial_conv.W, spatial_conv.b, stride=2,
                                     pad=1, grid=grid)
    F.softmax_cross_entropy(spatial_fc(gather(F.relu(h), grid)), t).backward()
    assert_agreed(grid, [difference(f"{name}.grad", getattr(a, name).grad,
                                    getattr(b, name).grad, np.float64)
                         for a, b in ((spatial_conv, conv), (spatial_fc, fc))
                         for name in ("W", "b")])


# -- sum_over_grid ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, image", GRIDS)
def test_sum_over_grid_of_tile_sums_is_the_whole_images_sum(grid, image, dtype):
    x = np.random.RandomState(4).uniform(-1, 1, image).astype(dtype)
    xv = chainer.Variable(x.copy())
    loss = F.sum(xv ** 2)
    loss.backward()

    xt = chainer.Variable(grid.tile(x))
    total = sum_over_grid(F.sum(xt ** 2), grid)
    total.backward()
    assert_agreed(grid, [difference("sum", total.array, loss.array, dtype),
                         difference("x.grad", xt.grad, grid.tile(xv.grad), dtype)])


@pytest.mark.parametrize("shape", [
    pytest.param((1, 2), marks=pytest.mark.mpi(min_size=2)),
    pytest.param((3, 1), marks=pytest.mark.mpi(min_size=3)),
    pytest.param((2, 2), marks=pytest.mark.mpi(min_size=4)),
])
def test_sum_over_grid_adds_arrays_over_the_grid_only_and_passes_the_gradient_on(grid):
    # each rank's value tells its group and grid rank apart: the sum is over one group
    x = np.full((2, 3), 10.0 ** grid.rank + 1000 * grid.group, np.float32)
    xv = chainer.Variable(x)
    y = sum_over_grid(xv, grid)
    g = np.arange(6, dtype=np.float32).reshape(2, 3) + grid.rank
    y.grad = g.copy()
    y.backward()
    want = np.full((2, 3), sum(10.0 ** r for r in range(grid.size)) + 1000 * grid.group
                   * grid.size, np.float32)
    assert_agreed(grid, [difference("sum", y.array, want, np.float32),
                         difference("x.grad", xv.grad, g, np.float32)])


# -- mean_squared_error -------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, image", GRIDS)
def test_mean_squared_error_is_the_whole_images(grid, image, dtype):
    rng = np.random.RandomState(5)
    y, t = (rng.uniform(-1, 1, image).astype(dtype) for _ in range(2))
    yv, tv = chainer.Variable(y.copy()), chainer.Variable(t.copy())
    loss = F.mean_squared_error(yv, tv)
    loss.backward()

    yt, tt = chainer.Variable(grid.tile(y)), chainer.Variable(grid.tile(t))
    got = mean_squared_error(yt, tt, grid)
    got.backward()
    assert_agreed(grid, [difference("loss", got.array, loss.array, dtype),
                         difference("y.grad", yt.grad, grid.tile(yv.grad), dtype),
                         difference("t.grad", tt.grad, grid.tile(tv.grad), dtype)])


# -- SpatialGrid --------------------------------------------------------------------


def balanced(n: int, parts: int, index: int) -> slice:
    """Part ``index`` of ``n`` rows split ``parts`` ways, the larger parts first."""
    sizes = [n // parts + (1 if r < n % parts else 0) for r in range(parts)]
    return slice(sum(sizes[:index]), sum(sizes[:index + 1]))


@pytest.mark.parametrize("shape, coords, spatial", [
    pytest.param((1, 2), [(0, 0), (0, 1)], (31, 29), marks=pytest.mark.mpi(min_size=2)),
    pytest.param((2, 2), [(0, 0), (0, 1), (1, 0), (1, 1)], (31, 29),
                 marks=pytest.mark.mpi(min_size=4)),
    pytest.param((1, 1, 2), [(0, 0, 0), (0, 0, 1)], (5, 6, 9),
                 marks=pytest.mark.mpi(min_size=2)),
])
def test_coordinates_neighbours_and_tiles_are_row_major(grid, shape, coords, spatial):
    problems = []
    mine = coords[grid.rank]
    if grid.coords != mine:
        problems.append(f"coords {grid.coords}, want {mine}")
    for axis in range(len(shape)):
        for step in (-1, 1):
            there = list(mine)
            there[axis] += step
            want = coords.index(tuple(there)) if tuple(there) in coords else None
            if grid.neighbour(axis, step) != want:
                problems.append(f"neighbour({axis}, {step}) = {grid.neighbour(axis, step)}, "
                                f"want {want}")
    want_slices = tuple(balanced(n, shape[a], mine[a]) for a, n in enumerate(spatial))
    if grid.tile_slices(spatial) != want_slices:
        problems.append(f"tile_slices{spatial} = {grid.tile_slices(spatial)}, "
                        f"want {want_slices}")
    # axes beyond the grid's are not split
    longer = spatial + (7,)
    if grid.tile_slices(longer) != want_slices + (slice(0, 7),):
        problems.append(f"tile_slices{longer} = {grid.tile_slices(longer)}")
    x = np.arange(2 * math.prod(spatial)).reshape((2, 1) + spatial)
    tile = grid.tile(x)
    if not (tile.flags.c_contiguous and np.array_equal(tile, x[(slice(None),) * 2
                                                            + want_slices])):
        problems.append(f"grid.tile gives {tile.shape}, not the contiguous tile")
    assert_agreed(grid, problems)


@pytest.mark.mpi(min_size=2)
def test_tile_slices_name_the_axes_and_sizes_that_do_not_fit(grids):
    grid = grids((1, 2))
    with pytest.raises(ValueError, match=r"spatial shape \(9,\) has fewer axes than the grid "
                                         r"\(1, 2\) splits"):
        grid.tile_slices((9,))
    with pytest.raises(ValueError, match="spatial axis 1 has 1 rows, fewer than the grid's 2 "
                                         "ranks along it"):
        grid.tile_slices((5, 1))
    with pytest.raises(ValueError, match=r"at least 2 spatial axes, not shape \(2, 3, 4\)"):
        grid.tile(np.zeros((2, 3, 4)))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape, message", [
    ((), r"shape \(\) must have 1 to 3 positive entries"),
    ((2, 0), r"shape \(2, 0\) must have 1 to 3 positive entries"),
    ((1, -2), r"shape \(1, -2\) must have 1 to 3 positive entries"),
    ((1, 1, 1, 1), r"shape \(1, 1, 1, 1\) must have 1 to 3 positive entries"),
])
def test_a_bad_grid_shape_is_a_value_error_naming_it(mcomm, shape, message):
    with pytest.raises(ValueError, match=message):
        SpatialGrid(mcomm, shape)


@pytest.mark.mpi(min_size=1)
def test_a_grid_whose_size_does_not_divide_the_communicators_names_both(mcomm):
    size = mcomm.size + 1
    with pytest.raises(ValueError, match=rf"shape \({size},\) needs a multiple of {size} ranks; "
                                         rf"the communicator has {mcomm.size} "):
        SpatialGrid(mcomm, (size,))
    with pytest.raises(ValueError, match=rf"needs a multiple of {2 * size} ranks"):
        SpatialGrid(mcomm, (1, 2, size))


@pytest.mark.mpi(min_size=1)
def test_a_grid_needs_an_mnpar_communicator_and_int_entries(mcomm, world):
    with pytest.raises(TypeError, match="SpatialGrid needs an mnpar communicator, not"):
        SpatialGrid(world, (1,))
    with pytest.raises(TypeError, match="shape must be a sequence of ints, not 2"):
        SpatialGrid(mcomm, 2)


@pytest.mark.mpi(min_size=4)
def test_four_ranks_in_a_1x2_grid_make_two_sample_groups(mcomm):
    four = mcomm.split(int(mcomm.rank >= 4), mcomm.rank)
    grid = SpatialGrid(four, (1, 2)) if mcomm.rank < 4 else None
    try:
        if grid is None:
            pytest.skip(f"rank {mcomm.rank} is left over: the grid uses ranks 0..3")
        problems = []
        got = (grid.groups, grid.group, grid.rank, grid.spatial_comm.size,
               grid.spatial_comm.rank, grid.sample_comm.size, grid.sample_comm.rank)
        want = (2, four.rank // 2, four.rank % 2, 2, four.rank % 2, 2, four.rank // 2)
        if got != want:
            problems.append(f"(groups, group, rank, spatial size and rank, sample size and "
                            f"rank) = {got}, want {want}")
        # the sample group holds the same tile of other samples; the spatial, one sample's
        members = (list(grid.spatial_comm.allgather_obj(four.rank)),
                   list(grid.sample_comm.allgather_obj(four.rank)))
        want_members = ([2 * grid.group, 2 * grid.group + 1], [grid.rank, grid.rank + 2])
        if members != want_members:
            problems.append(f"spatial and sample members {members}, want {want_members}")
        assert_agreed(grid, problems)
    finally:
        if grid is not None:
            free(grid)
        four.finalize()


@pytest.mark.mpi(min_size=2)
def test_tiles_not_cut_by_the_balanced_rule_raise_on_every_rank(grids):
    grid = grids((1, 2))
    # the smaller tile first: 14 then 15 columns, where 29 split two ways is 15 then 14
    x = np.zeros((1, 1, 4, 14 if grid.rank == 0 else 15))
    problems = []
    try:
        gather(x, grid)
        problems.append("no error")
    except ValueError as error:
        if not re.search(r"spatial gather: the tiles along spatial axis 1 \(\[14, 15\] rows "
                         r"on grid ranks 0..1\) are not the balanced tiles of one image of 29 "
                         r"rows; ranks \[0, 1\] disagree", str(error)):
            problems.append(f"the message: {error}")
    assert_agreed(grid, problems)
