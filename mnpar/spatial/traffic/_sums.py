"""The two sums that keep tiles and replicas exact.

========================  =====================  ===============================
node                      forward                backward
========================  =====================  ===============================
``SumGrads``              identity               each gradient summed over the
                                                 grid (one packed allreduce)
``SumOverGrid`` (_whole)  summed over the grid   identity
========================  =====================  ===============================

Where a value that every rank holds alike (a parameter, a global mean) meets a
tile, each rank's gradient of it is its tile's share: ``SumGrads`` in front
of the meeting makes it the whole image's on every rank.
"""
from typing import Any, Sequence, Tuple

import chainer

from ._grid import AnyGrid
from ._halo import no_second_order


class SumGrads(chainer.FunctionNode):
    """The identity, whose backward sums each gradient over the grid (one allreduce)."""

    def __init__(self, grid: AnyGrid, what: str = "a parameter's gradient") -> None:
        self.grid = grid
        self.what = what

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        self.specs = [(x.shape, x.dtype) for x in inputs]
        return tuple(inputs)

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        no_second_order(self.what)
        present = [g.array for g in grad_outputs if g is not None]
        xp: Any = chainer.backend.get_array_module(*present)
        grads = [g.array if g is not None else xp.zeros(*self.specs[i])
                 for i, g in enumerate(grad_outputs)]
        summed = self.grid.sum_arrays(grads, self.what)
        return tuple(chainer.Variable(summed[i]) for i in indexes)


def sum_grads(grid: AnyGrid, variables: Sequence[Any], what: str) -> Tuple[Any, ...]:
    """``variables`` through one ``SumGrads`` node (nothing where the grid has one rank)."""
    if grid.size == 1 or not variables:
        return tuple(variables)
    return SumGrads(grid, what).apply(tuple(variables))
