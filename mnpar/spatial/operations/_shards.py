"""Parameters cut by pixel: each rank of the grid holds only the part its tile uses.

A locally connected layer has a weight per output pixel, and a fully
connected layer after the convolutions a weight column per input pixel: a
rank needs only its tile's. ``Sharded`` links keep just that part (memory
W/P); its gradient is this rank's alone and is never summed. The link
records whose part it holds in the persistent ``shard``::

    shard = [grid rank, grid size, layout...]     (-1 everywhere: not sharded yet)

so a snapshot (each rank writes its own file) resumes into a fresh model:
``serialize`` sizes the parameters to the stored parts before loading them,
and the first forward checks, together with the tiles' shapes, that every
rank holds its own part (a rank that loaded another's snapshot is an error
on every rank).

Other code tells a sharded parameter by its attribute ``mnpar_shard_grid``
(the ``SpatialGrid``): its ranks hold disjoint parts, so a norm over the
whole model sums its squares over ``grid.spatial_comm``; every other
parameter of a spatial model is the same on every rank of the grid, and the
spatial links and converted models declare those (``mnpar_replicas``, read
by ``mnpar.optimizer_hooks.GradientClipping``).
"""
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import chainer
import numpy as np

from ..._arrays import get_array_module
from ...communicators import Communicator
from .._errors import SpatialError
from ..traffic._grid import SpatialGrid

WIDTH = 8
HINT = ("a rank holds another rank's part of the weights: each rank must resume from its own "
        "snapshot, on a grid of the same shape")


def shard_grid(param: Any) -> Optional[SpatialGrid]:
    """The grid over whose ranks ``param`` is cut (each holds a disjoint part), or None."""
    return getattr(param, "mnpar_shard_grid", None)


Replicas = List[Tuple[Communicator, List[chainer.Parameter]]]


def replicas(grid: SpatialGrid, params: Iterable[chainer.Parameter]) -> Replicas:
    """Of a link's ``params``, those every rank of ``grid`` holds alike, for
    ``mnpar.optimizer_hooks.GradientClipping`` (``mnpar_replicas``): each counts once."""
    alike = [p for p in params if shard_grid(p) is None]
    return [(grid.spatial_comm, alike)] if alike and grid.size > 1 else []


class Sharded:
    """A link whose parameters ``sharded_names`` hold this rank's part only."""

    sharded_names: Tuple[str, ...] = ()
    grid: SpatialGrid
    shard: Any

    def _init_shard(self) -> None:
        self.add_persistent("shard", np.full(WIDTH, -1, np.int64))  # type: ignore[attr-defined]
        self._mnpar_local_persistents = ("shard",)

    @property
    def is_sharded(self) -> bool:
        """True once the parameters hold this rank's part only."""
        return int(self.shard[0]) >= 0

    @property
    def mnpar_piece(self) -> bool:
        """Holds a piece of the model (chainer's own gradient clipping warns)."""
        return self.is_sharded and self.grid.size > 1

    def _layout(self) -> Tuple[int, ...]:
        return tuple(int(v) for v in self.shard[2:] if v >= 0)

    def _set_shards(self, parts: Dict[str, Any], layout: Sequence[int]) -> None:
        """Keeps ``parts`` (name -> array) as this rank's parameters."""
        if len(layout) > WIDTH - 2:
            raise ValueError(f"a shard layout of {len(layout)} ints is more than {WIDTH - 2}")
        for name, part in parts.items():
            param = getattr(self, name)
            param.array = get_array_module(part).ascontiguousarray(part)
            param.grad = None
            param.mnpar_shard_grid = self.grid
        shard = np.full(WIDTH, -1, np.int64)
        shard[:2] = (self.grid.rank, self.grid.size)
        shard[2:2 + len(layout)] = layout
        self.shard = shard

    def _mine(self) -> int:
        """1 if this rank holds its own parts (or none yet), else 0: for the tiles' check."""
        if not self.is_sharded:
            return 1
        return int(int(self.shard[0]) == self.grid.rank and int(self.shard[1]) == self.grid.size)

    def _check_mine(self, what: str) -> None:
        if not self._mine():
            raise SpatialError(f"{what} holds the parts of grid rank {int(self.shard[0])} of "
                               f"{int(self.shard[1])}, but runs on grid rank {self.grid.rank} "
                               f"of {self.grid.size}: each rank must resume from its own "
                               "snapshot, on a grid of the same shape")

    def _whole_only(self, what: str) -> None:
        if self.is_sharded:
            raise SpatialError(f"{what} holds only this rank's part of its weights (it ran on "
                               "tiles before), so it cannot take a whole image; give it tiles")

    def serialize(self, serializer: Any) -> None:
        """As chainer's, but a stored shard resizes the parameters before they are loaded."""
        if isinstance(serializer, chainer.serializer.Deserializer):
            try:
                stored = serializer("shard", None)
            except KeyError:
                stored = None
            if stored is not None and int(np.asarray(stored)[0]) >= 0:
                for name in self.sharded_names:
                    param = getattr(self, name, None)
                    if param is None:
                        continue
                    value = serializer(name, None)
                    xp = np if param.array is None else get_array_module(param.array)
                    dtype = param.dtype if param.array is not None else value.dtype
                    param.array = xp.zeros(value.shape, dtype)
                    param.grad = None
                    param.mnpar_shard_grid = self.grid
        super().serialize(serializer)  # type: ignore[misc]
        if self.is_sharded:
            for name in self.sharded_names:
                param = getattr(self, name, None)
                if param is not None:
                    param.mnpar_shard_grid = self.grid
