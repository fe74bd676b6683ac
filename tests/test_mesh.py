"""The mesh: axes laid out row-major (tensor fastest), a communicator per set of axes,
and ranks that ask for different meshes refused on every rank."""
import itertools

import numpy as np
import pytest

import mnpar

pytestmark = pytest.mark.mpi(min_size=1)


def layouts(size):
    """Every way to lay ``size`` ranks over the four axes (each a divisor)."""
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    for data, pipeline, spatial in itertools.product(divisors, repeat=3):
        if size % (data * pipeline * spatial) == 0:
            yield dict(data=data, pipeline=pipeline, spatial=spatial,
                       tensor=size // (data * pipeline * spatial))


def test_every_layout_gives_each_axis_the_ranks_that_differ_along_it(mcomm):
    for sizes in layouts(mcomm.size):
        mesh = mnpar.Mesh(mcomm, **sizes)
        try:
            coords = np.unravel_index(mcomm.rank, [sizes[a] for a in mnpar.Mesh.AXES])
            assert mesh.coords == dict(zip(mnpar.Mesh.AXES, map(int, coords)))
            assert mesh.shape == {a: sizes[a] for a in mnpar.Mesh.AXES}
            everyone = mcomm.allgather_obj(mesh.coords)
            for n in range(len(mnpar.Mesh.AXES) + 1):
                for axes in itertools.combinations(mnpar.Mesh.AXES, n):
                    sub = mesh.comm(*reversed(axes))  # any order names the same axes
                    members = sub.allgather_obj(mcomm.rank)
                    same = [r for r, c in enumerate(everyone)
                            if all(c[a] == mesh.coords[a] for a in mnpar.Mesh.AXES
                                   if a not in axes)]
                    assert members == same, (sizes, axes)
                    assert sub.rank == members.index(mcomm.rank)
            for axis in mnpar.Mesh.AXES:
                assert mesh.size(axis) == sizes[axis] == mesh.comm(axis).size
                assert mesh.rank(axis) == mesh.coords[axis] == mesh.comm(axis).rank
            assert mesh.rank_of() == mcomm.rank
            assert mesh.rank_of(**{a: 0 for a in mnpar.Mesh.AXES}) == 0
        finally:
            mesh.free()


def test_one_axis_may_be_minus_one(mcomm):
    mesh = mnpar.Mesh(mcomm, data=-1)
    assert mesh.shape["data"] == mcomm.size and mesh.comm("data").size == mcomm.size
    assert mesh.comm("data") is mcomm  # the axis that spans the world is the world
    assert mesh.comm().size == 1 and mesh.comm("tensor").size == 1
    assert f"data={mcomm.size}" in repr(mesh) or mcomm.size == 1
    mesh.free()


def test_sizes_that_do_not_make_the_world_are_refused_on_every_rank(mcomm):
    with pytest.raises(ValueError, match=rf"Mesh: tensor={mcomm.size + 1} makes "
                                         rf"{mcomm.size + 1} ranks, but the communicator has "
                                         rf"{mcomm.size}"):
        mnpar.Mesh(mcomm, tensor=mcomm.size + 1)
    with pytest.raises(ValueError, match="only one axis may be -1, not data, tensor"):
        mnpar.Mesh(mcomm, data=-1, tensor=-1)
    with pytest.raises(ValueError, match=r"leaves tensor=-1 no whole number of ranks"):
        mnpar.Mesh(mcomm, data=mcomm.size + 1, tensor=-1)
    with pytest.raises(ValueError, match="Mesh: data=0 must be 1 or more"):
        mnpar.Mesh(mcomm, data=0)
    with pytest.raises(TypeError, match=r"Mesh: tensor=2.0 must be an int"):
        mnpar.Mesh(mcomm, tensor=2.0)
    with pytest.raises(TypeError, match="Mesh needs an mnpar communicator, not Intracomm"):
        mnpar.Mesh(mcomm.mpi_comm, tensor=1)


@pytest.mark.mpi(min_size=2)
def test_ranks_that_ask_for_different_meshes_are_refused_on_every_rank(mcomm):
    asked = dict(tensor=mcomm.size) if mcomm.rank == 0 else dict(data=mcomm.size)
    with pytest.raises(ValueError, match=rf"the ranks asked for different meshes \(rank 0: "
                                         rf"tensor={mcomm.size}; rank 1: data={mcomm.size}"):
        mnpar.Mesh(mcomm, **asked)
    mesh = mnpar.Mesh(mcomm, tensor=-1)  # nothing was left half made
    assert mesh.comm("tensor").allgather_obj(1) == [1] * mcomm.size
    mesh.free()


def test_unknown_axes_and_coordinates_are_refused(mcomm):
    mesh = mnpar.Mesh(mcomm, tensor=-1)
    try:
        with pytest.raises(ValueError, match="Mesh.comm: unknown axis 'model'; the axes are "
                                             "data, pipeline, spatial, tensor"):
            mesh.comm("model")
        with pytest.raises(ValueError, match="an axis is named twice"):
            mesh.comm("tensor", "tensor")
        with pytest.raises(ValueError, match=rf"tensor={mcomm.size} is out of range"):
            mesh.rank_of(tensor=mcomm.size)
        with pytest.raises(ValueError, match="Mesh.rank_of: unknown axis 'model'"):
            mesh.rank_of(model=0)
    finally:
        mesh.free()


def test_a_spatial_axis_makes_a_spatial_grid(mcomm):
    mesh = mnpar.Mesh(mcomm, spatial=-1)
    grid = mnpar.spatial.SpatialGrid(mesh.comm("spatial"), (1, mcomm.size))
    assert grid.spatial_comm.size == mcomm.size and grid.groups == 1
    grid.free()
    mesh.free()
