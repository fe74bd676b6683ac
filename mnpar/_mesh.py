"""The mesh: one object that names a job's axes and gives each its communicator.

Every split of a model is an axis of one mesh over the ranks: ``data``
(replicas), ``pipeline`` (stages), ``spatial`` (tiles of an image) and
``tensor`` (layers split inside). The axes' sizes multiply to the
communicator's size; ranks are laid out row-major in that fixed order, so
the ``tensor`` axis varies fastest (its ranks are neighbours, usually on one
node: tensor parallelism talks at every layer) and ``data`` slowest (it
talks once per update)::

    Mesh(comm, data=2, tensor=2)            Mesh(comm, data=2, pipeline=2)
    rank    0  1  2  3                      rank      0  1  2  3
    data    0  0  1  1                      data      0  0  1  1
    tensor  0  1  0  1                      pipeline  0  1  0  1

``mesh.comm(axis)`` is the communicator of the ranks that differ only along
``axis`` (its rank is this rank's coordinate there); ``mesh.comm(a, b)`` of
those that differ along ``a`` and ``b``; ``mesh.comm()`` this rank alone.
Every one of them is made when the mesh is made (collective splits, in one
order on every rank), so asking for one later is local and cannot hang. A
spatial grid over the spatial axis is
``mnpar.spatial.SpatialGrid(mesh.comm("spatial"), shape)``.

The ranks first agree on the mesh: one ``allgather`` of the sizes each rank
asked for, and a ``ValueError`` on every rank, listing them, where they
differ.
"""
import itertools
import math
from typing import Any, Dict, List, Tuple

from ._failfast import failing
from .communicators._facade import Communicator, require_communicator

AXES: Tuple[str, ...] = ("data", "pipeline", "spatial", "tensor")  # slowest first


def _sizes(size: int, asked: Dict[str, int]) -> Dict[str, int]:
    """The axes' sizes, with one ``-1`` made the rest of ``size``; ValueError otherwise."""
    for axis, n in asked.items():
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"Mesh: {axis}={n!r} must be an int (ranks along the axis)")
        if n < 1 and n != -1:
            raise ValueError(f"Mesh: {axis}={n} must be 1 or more (or -1: the rest)")
    free = [a for a, n in asked.items() if n == -1]
    if len(free) > 1:
        raise ValueError(f"Mesh: only one axis may be -1, not {', '.join(free)}")
    fixed = math.prod(n for n in asked.values() if n != -1)
    sizes = dict(asked)
    if free:
        if size % fixed:
            raise ValueError(f"Mesh: {_text(asked)} leaves {free[0]}=-1 no whole number of "
                             f"ranks: {fixed} does not divide the communicator's {size}")
        sizes[free[0]] = size // fixed
    elif fixed != size:
        raise ValueError(f"Mesh: {_text(asked)} makes {fixed} ranks, but the communicator has "
                         f"{size}; the sizes must multiply to it (give one axis -1 for the "
                         "rest)")
    return sizes


def _text(sizes: Dict[str, int]) -> str:
    return ", ".join(f"{a}={n}" for a, n in sizes.items() if n != 1) or "every axis 1"


class Mesh:
    """Names the axes of a job (data, pipeline, spatial, tensor) over a communicator.

    Args:
        comm: an mnpar communicator over every rank of the job.
        data: ranks along the data axis (replicas that average gradients).
        pipeline: ranks along the pipeline axis (stages).
        spatial: ranks along the spatial axis (tiles of an image).
        tensor: ranks along the tensor axis (layers split inside).

    An axis left out has size 1. The sizes must multiply to ``comm.size``;
    one of them may be ``-1``, the rest of it. Every rank of ``comm`` makes
    the mesh (collective) with the same sizes.

    Raises:
        TypeError: ``comm`` is not an mnpar communicator, or a size is not an int.
        ValueError: the sizes do not multiply to ``comm.size``, or the ranks
            asked for different meshes (on every rank).

    Example::

        comm = mnpar.create_communicator("naive")          # 4 ranks
        mesh = mnpar.Mesh(comm, data=2, tensor=2)
        model = mnpar.tensor.parallelize(model, mesh, plan)  # over mesh.comm("tensor")
        optimizer = mnpar.create_multi_node_optimizer(
            chainer.optimizers.Adam(), mesh.comm("data")).setup(model)
    """

    AXES = AXES

    def __init__(self, comm: Communicator, *, data: int = 1, pipeline: int = 1,
                 spatial: int = 1, tensor: int = 1) -> None:
        require_communicator(comm, "Mesh")
        asked = {"data": data, "pipeline": pipeline, "spatial": spatial, "tensor": tensor}
        everyone = comm.allgather_obj(tuple(asked.values()))  # first: agree, then check
        if len(set(everyone)) > 1:
            listing = "; ".join(f"rank {r}: {_text(dict(zip(AXES, s)))}"
                                for r, s in enumerate(everyone))
            raise ValueError(f"Mesh: the ranks asked for different meshes ({listing}); every "
                             "rank must make the same mesh")
        mine = _sizes(comm.size, asked)
        self.world = comm
        self.shape: Dict[str, int] = {a: mine[a] for a in AXES}
        index = comm.rank
        coords: Dict[str, int] = {}
        for axis in reversed(AXES):
            index, coords[axis] = divmod(index, self.shape[axis])
        self.coords: Dict[str, int] = {a: coords[a] for a in AXES}
        self._comms: Dict[Tuple[str, ...], Communicator] = {}
        self._made: List[Communicator] = []
        split = [a for a in AXES if self.shape[a] > 1]
        for n in range(len(split)):  # every subset of the split axes but all of them
            for axes in itertools.combinations(split, n):
                self._comms[axes] = self._split(axes)
        self._comms[tuple(split)] = comm

    def _split(self, axes: Tuple[str, ...]) -> Communicator:
        """The communicator of the ranks whose coordinates differ along ``axes`` only."""
        color = key = 0
        for a in AXES:
            if a in axes:
                key = key * self.shape[a] + self.coords[a]
            else:
                color = color * self.shape[a] + self.coords[a]
        made = self.world.split(color, key)
        self._made.append(made)
        return made

    def comm(self, *axes: str) -> Communicator:
        """The communicator over ``axes``: the ranks whose coordinates along every other
        axis are this rank's, ranked row-major over ``axes`` (in the mesh's order).

        ``comm("tensor")`` is the tensor-parallel group, ``comm("data")`` the
        replicas to average gradients over, ``comm("pipeline", "tensor")`` the
        ranks that hold one replica's pieces; ``comm()`` is this rank alone.

        Raises:
            ValueError: an axis that is not one of ``Mesh.AXES``, or named twice.
        """
        unknown = [a for a in axes if a not in AXES]
        if unknown:
            raise ValueError(f"Mesh.comm: unknown axis {unknown[0]!r}; the axes are "
                             f"{', '.join(AXES)}")
        if len(set(axes)) != len(axes):
            raise ValueError(f"Mesh.comm: an axis is named twice in {axes!r}")
        return self._comms[tuple(a for a in AXES if a in axes and self.shape[a] > 1)]

    def size(self, axis: str) -> int:
        """The number of ranks along ``axis``."""
        self.comm(axis)
        return self.shape[axis]

    def rank(self, axis: str) -> int:
        """This rank's coordinate along ``axis``."""
        self.comm(axis)
        return self.coords[axis]

    def rank_of(self, **coords: int) -> int:
        """The rank (of ``world``) at ``coords``; axes left out take this rank's coordinate.

        Raises:
            ValueError: an unknown axis or a coordinate out of range.
        """
        index = 0
        for a in AXES:
            c = coords.pop(a, self.coords[a])
            if not 0 <= c < self.shape[a]:
                raise ValueError(f"Mesh.rank_of: {a}={c} is out of range for {self.shape[a]} "
                                 "ranks")
            index = index * self.shape[a] + c
        if coords:
            raise ValueError(f"Mesh.rank_of: unknown axis {next(iter(coords))!r}; the axes "
                             f"are {', '.join(AXES)}")
        return index

    def free(self) -> None:
        """Finalizes the communicators the mesh made (collective over ``world``; not
        ``world`` itself). Called while an exception unwinds, it only tells the peers."""
        for c in self._made if failing() else reversed(self._made):
            c.finalize()
        self._made = []

    def __deepcopy__(self, memo: dict) -> "Mesh":
        return self  # a handle on communicators: copies of a model share it

    def __copy__(self) -> "Mesh":
        return self

    def __repr__(self) -> str:
        axes = ", ".join(f"{a}={self.shape[a]}" for a in AXES if self.shape[a] > 1)
        at = ", ".join(f"{a}={self.coords[a]}" for a in AXES if self.shape[a] > 1)
        return f"Mesh({axes or 'one rank'}; this rank at {at or '0'})"


def tensor_comm(mesh_or_comm: Any, op: str) -> Communicator:
    """The tensor-parallel communicator of a ``Mesh``, or the communicator itself."""
    if isinstance(mesh_or_comm, Mesh):
        return mesh_or_comm.comm("tensor")
    if isinstance(mesh_or_comm, Communicator):
        return mesh_or_comm
    raise TypeError(f"{op} needs a mnpar.Mesh or an mnpar communicator, not "
                    f"{type(mesh_or_comm).__name__}")

