"""``L.EmbedID`` split by vocabulary: each rank holds the rows of its part of the words.

::

    ids (whole) -> this rank's ids (others: -1, a zero row) -> embed_id(W_r)
        -> reduce_from_group (one allreduce forward; none backward)
        or, with sequence=axis, reduce_scatter_from_group along it

Every id lies in exactly one rank's part, so the sum is the row one process
looks up. An id outside the vocabulary (other than ``ignore_label``) would
be nobody's: it is refused on every rank (the ids are the same on every
rank), where one process would fail or wrap around.
"""
from typing import Any, Optional

import chainer.functions as F
import chainer.links as L

from .._arrays import get_array_module
from ..functions._conjugate import ReduceFromGroup, ReduceScatterFromGroup
from ..functions._group_ops import balanced
from ._marks import array_of, mark, trusted
from ._split_link import Split


class VocabEmbedID(Split, L.EmbedID):
    """``L.EmbedID`` holding the rows of ``W`` of its part of the vocabulary."""

    def _tp_split(self, sequence: Optional[int]) -> None:
        self._tp_sequence = sequence
        self._tp_words = self._tp_bounds(self.W.shape[0], 1, "words")
        self._tp_vocabulary = self.W.shape[0]
        self._tp_cut(("W",), 0, self._tp_words)

    def forward(self, x: Any) -> Any:
        self._tp_running()
        if self._tp_mark(x) is not None:
            raise self._tp_error("its ids are a part; give it the whole ids")
        comm = self._tp_comm
        ids = array_of(x)
        xp = get_array_module(ids)
        start, stop = self._tp_words[comm.rank], self._tp_words[comm.rank + 1]
        valid = ids != self.ignore_label if self.ignore_label is not None else xp.ones_like(
            ids, bool)
        words = ids[valid]
        if words.size and (int(words.min()) < 0 or int(words.max()) >= self._tp_vocabulary):
            bad = int(words.min()) if int(words.min()) < 0 else int(words.max())
            raise self._tp_error(f"id {bad} is outside its vocabulary of "
                                 f"{self._tp_vocabulary} words")
        inside = valid & (ids >= start) & (ids < stop)
        local = xp.where(inside, ids - start, -1).astype(ids.dtype, copy=False)
        with trusted():
            y = F.embed_id(local, self.W, ignore_label=-1)
            if self._tp_sequence is None:
                return ReduceFromGroup(comm).apply((y,))[0]
            axis = self._tp_sequence % y.ndim
            cut = balanced(y.shape[axis], comm.size)
            y = ReduceScatterFromGroup(comm, axis, cut).apply((y,))[0]
        return mark(y, self._tp_shard(axis, cut[-1], cut))
