"""A group of parameters sharded together, and the buffers each rank keeps for it.

=====================  ====================================  ===================================
stage                  parameters                            gradients
=====================  ====================================  ===================================
1                      whole, every parameter a view of one  whole (the communicator's mean);
                       flat buffer; the shard a view of it   the shard's a view of each
2                      as stage 1                            the shard only (``grad_shard``)
3                      the shard only (``shard``); whole     the shard only
                       while a link runs (``_gather``)
=====================  ====================================  ===================================

The shard parameters the wrapped optimizer updates are views of ``shard``,
one per parameter (``view``); their gradients views of ``grad_shard`` (or,
in stage 1, of the whole gradients).
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import chainer
import numpy as np

from .._arrays import device_of, get_array_module
from ._shards import FlatLayout, Piece


class Group:
    """Parameters of one dtype (stage 3: of one link and dtype) laid end to end.

    Args:
        names: the parameters' names in the model, in layout order.
        params: the model's parameters, initialized, on one device.
        size: ranks of the data axis.
        rank: this rank's index on it.
        keep_whole: stages 1 and 2: the parameters stay whole, as views of one
            flat buffer that the allgather fills; stage 3: only the shard stays.
        grad_shard: keep a gradient shard (stages 2 and 3).
    """

    def __init__(self, names: Sequence[str], params: Sequence[chainer.Parameter], size: int,
                 rank: int, keep_whole: bool, grad_shard: bool) -> None:
        self.names = list(names)
        self.params: List[Any] = list(params)
        self.layout = FlatLayout(self.names, [p.shape for p in self.params], size)
        self.lo, self.hi = self.layout.bounds[rank]
        self.pieces: List[Piece] = self.layout.shard(rank)
        first: Any = self.params[0].array
        self.xp = get_array_module(first)
        self.dtype = first.dtype
        with device_of(first):
            if keep_whole:
                self.flat: Optional[Any] = self.xp.empty(self.layout.total, self.dtype)
                self.whole: List[Any] = []
                for slot, p in zip(self.layout.slots, self.params):
                    view = self.flat[slot.offset: slot.offset + slot.size].reshape(slot.shape)
                    view[...] = p.array
                    p.array = view
                    self.whole.append(view)
                self.shard = self.flat[self.lo: self.hi]
            else:
                self.flat = None
                self.whole = []
                self.shard = self.xp.empty(self.hi - self.lo, self.dtype)
                for piece, p in zip(self.pieces, self.params):
                    self.view(piece.slot)[...] = p.array.reshape(-1)[piece.start: piece.stop]
            self.grad_shard = (self.xp.zeros(self.hi - self.lo, self.dtype) if grad_shard
                               else None)
        self.fresh = True  # no gradient reduced into grad_shard since the last update
        self.token: Any = None  # stage 3: the leaf every gather of this group hangs from

    @property
    def gpu(self) -> bool:
        return self.xp is not np

    def view(self, slot: int) -> Any:
        """This rank's shard of parameter ``slot`` (1-D, possibly empty), in ``shard``."""
        piece = self.pieces[slot]
        return self.shard[piece.flat - self.lo: piece.flat - self.lo + piece.size]

    def grad_view(self, slot: int) -> Any:
        """Its gradient's shard, in ``grad_shard``."""
        assert self.grad_shard is not None
        piece = self.pieces[slot]
        return self.grad_shard[piece.flat - self.lo: piece.flat - self.lo + piece.size]

    def whole_grad_view(self, slot: int) -> Any:
        """Stage 1: the shard of the parameter's whole gradient (a view where contiguous)."""
        piece = self.pieces[slot]
        return self.params[slot].grad.reshape(-1)[piece.start: piece.stop]

    def moved(self) -> List[str]:
        """Names of parameters whose array is no longer this group's view (stages 1, 2):
        replaced after setup, e.g. by ``to_device`` or an assignment."""
        return [n for n, p, v in zip(self.names, self.params, self.whole) if p.array is not v]

    def nbytes(self) -> int:
        return int(self.shard.nbytes)


def group_params(named: Sequence[Tuple[str, chainer.Parameter]],
                 unit_of: Optional[Dict[int, Any]] = None) -> List[Tuple[Any, List[str],
                                                                         List[Any]]]:
    """``named`` (sorted by name) split into groups: by dtype and device, and with
    ``unit_of`` (id of parameter -> its link) by link too; in a rank-independent order."""
    groups: Dict[Any, Tuple[List[str], List[Any]]] = {}
    order: List[Any] = []
    for name, p in named:
        a: Any = p.array
        device = getattr(a, "device", None)
        key = (id(unit_of[id(p)]) if unit_of is not None else None, str(a.dtype),
               None if device is None else getattr(device, "id", str(device)))
        if key not in groups:
            groups[key] = ([], [])
            order.append(key)
        groups[key][0].append(name)
        groups[key][1].append(p)
    return [(k, groups[k][0], groups[k][1]) for k in order]
