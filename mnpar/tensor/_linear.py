"""``L.Linear`` split by output columns or by input rows (Megatron's two halves).

::

    column: each rank holds rows bounds[r]:bounds[r + 1] of W (its output features)
        x (whole) -> copy_to_group -> x W_r^T + b_r   = this rank's part of y (cut on the
                                                         last axis), or gathered whole
    row: each rank holds columns bounds[r]:bounds[r + 1] of W (its input features)
        x_r (a part, or cut from a whole x) -> x_r W_r^T -> reduce_from_group -> + b
                                                         (the bias once, after the sum)

A column layer followed by a row layer with the same cut costs one
allreduce forward (the row's sum) and one backward (the column's copy).
With ``sequence=axis`` (sequence parallelism) the column layer gathers its
input's parts along that axis first (``gather_to_group``: reduce-scatter
backward) and the row layer reduce-scatters its sum along it
(``reduce_scatter_from_group``), so what lies between the blocks (norms,
dropout, residual adds) holds a part of the sequence.
"""
import math
from typing import Any, Optional

import chainer.functions as F
import chainer.links as L

from ..functions._conjugate import (
    GatherFromGroup,
    ReduceFromGroup,
    ReduceScatterFromGroup,
    ScatterToGroup,
)
from ..functions._group_ops import balanced
from ._guard import copied, gathered
from ._marks import mark, trusted
from ._params import cut_of, initialize_cut
from ._split_link import Split


class ColumnLinear(Split, L.Linear):
    """``L.Linear`` holding the rows of ``W`` (and ``b``) of its part of the outputs."""

    W: Any
    out_size: Any

    _tp_bounds_out: Any

    def _tp_split(self, unit: int, gather_output: bool, sequence: Optional[int]) -> None:
        self._tp_gather = gather_output
        self._tp_sequence = sequence
        self._tp_bounds_out = self._tp_bounds(self.out_size, unit, "output features")
        self._tp_cut(("W", "b"), 0, self._tp_bounds_out)

    def _initialize_params(self, in_size: int) -> None:
        initialize_cut(self.W, (self.out_size, in_size))

    def forward(self, x: Any, n_batch_axes: int = 1) -> Any:
        self._tp_running()
        comm, m = self._tp_comm, self._tp_mark(x)
        if self._tp_sequence is not None:
            axis = self._tp_sequence % len(x.shape)
            if m is None or m.axis != axis or m.pre != 1:
                raise self._tp_error(f"its input should be a part of the sequence axis {axis} "
                                     f"(sequence parallelism), but it is "
                                     f"{'whole' if m is None else m.describe()}")
            x = gathered(comm, x, axis)
        elif m is not None:
            raise self._tp_error(f"its input is {m.describe()}, not whole; a column layer "
                                 "takes a whole input (plan this layer 'row' to take a part "
                                 "of the input features)")
        else:
            x = copied(comm, x)
        if self.W.array is None:
            self._initialize_params(math.prod(x.shape[n_batch_axes:]))
        with trusted():
            y = F.linear(x, self.W, self.b, n_batch_axes)
            if self._tp_gather:
                return GatherFromGroup(comm, y.ndim - 1).apply((y,))[0]
        return mark(y, self._tp_shard(y.ndim - 1, self.out_size, self._tp_bounds_out))


class RowLinear(Split, L.Linear):
    """``L.Linear`` holding the columns of ``W`` of its part of the inputs; ``b`` whole."""

    W: Any
    out_size: Any

    def _tp_split(self, unit: int, sequence: Optional[int]) -> None:
        self._tp_unit = unit
        self._tp_sequence = sequence
        self._tp_in: Any = None
        if self.W.array is not None:
            self._tp_cut_in(self.W.shape[1])

    def _tp_cut_in(self, in_size: int) -> None:
        self._tp_in = self._tp_bounds(in_size, self._tp_unit, "input features")
        if cut_of(self.W) is None:
            self._tp_cut(("W",), 1, self._tp_in)

    def forward(self, x: Any, n_batch_axes: int = 1) -> Any:
        self._tp_running()
        comm, m = self._tp_comm, self._tp_mark(x)
        whole = m.whole_shape(tuple(x.shape)) if m is not None else tuple(x.shape)
        if len(whole) > n_batch_axes + 1:  # the features of several axes, flattened
            x = F.reshape(x, whole[:n_batch_axes] + (-1,))
            m = self._tp_mark(x)
        if self.W.array is None:
            self._tp_cut_in(math.prod(whole[n_batch_axes:]))
            initialize_cut(self.W, (self.out_size, math.prod(whole[n_batch_axes:])))
        bounds = self._tp_in
        last = len(x.shape) - 1
        if m is None:
            with trusted():
                x = ScatterToGroup(comm, last, bounds).apply((x,))[0]
        elif m.axis != last or m.pre != 1 or m.bounds != bounds:
            raise self._tp_error(
                f"its input is {m.describe()}, but it takes the input features cut at "
                f"{bounds} (the layer before it should be planned 'column' with the same "
                "unit)" if m.axis == last and m.pre == 1 else
                f"its input is {m.describe()}, not a part of its input features")
        with trusted():
            y = F.linear(x, self.W, None, n_batch_axes)
            if self._tp_sequence is None:
                y = ReduceFromGroup(comm).apply((y,))[0]
                if self.b is not None:
                    y = y + F.broadcast_to(self.b, y.shape)
                return y
            axis = self._tp_sequence % y.ndim
            cut = balanced(y.shape[axis], comm.size)
            y = ReduceScatterFromGroup(comm, axis, cut).apply((y,))[0]
            part = mark(y, self._tp_shard(axis, cut[-1], cut))
        if self.b is not None:
            with trusted():
                part = mark(part + F.broadcast_to(copied(comm, self.b), part.shape),
                            self._tp_mark(part))
        return part

