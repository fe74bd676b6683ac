"""What a (component, micro-batch) keeps between its forward and its backward.

A forward takes its inputs as fresh leaf Variables and keeps them, its
outputs (with their graph) and, on the rank with the loss, the loss. With
activation recomputation it keeps its outputs' graph not at all: only the
inputs, NumPy's random state and (on a GPU) a seed for cupy's, so that the
second forward, run just before the backward, draws what the first drew
(``replaying``; ``mnpar.random``'s replay on a GPU). After a split B it also keeps what W needs
(``_split.WeightWork``) until W runs.
"""
import contextlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import chainer
import numpy as np

from ._split import WeightWork, functions_behind


class Segment:
    """What a (component, micro-batch) keeps between its forward and backward."""

    __slots__ = ("inputs", "args", "outputs", "loss", "rng", "seed", "weight_work")

    def __init__(self) -> None:
        self.inputs: List[List[chainer.Variable]] = []  # per position of rank_in
        self.args: Tuple[Any, ...] = ()
        self.outputs: Any = None
        self.loss: Optional[chainer.Variable] = None
        self.rng: Any = None  # NumPy's random state before a forward to recompute
        self.seed: Optional[int] = None  # on a GPU, the seed of cupy's generator's replay
        self.weight_work: WeightWork = []

    def nbytes(self) -> int:
        """Bytes of the arrays it keeps: its graph's retained data, its inputs,
        outputs and, after a split B, its nodes' output gradients."""
        seen: Dict[int, int] = {}

        def add(a: Any) -> None:
            if a is not None and hasattr(a, "nbytes"):
                seen[id(a)] = a.nbytes
        for leaves in self.inputs:
            for leaf in leaves:
                add(leaf.array)
                add(leaf.grad)
        outs, _ = as_list(self.outputs) if self.outputs is not None else ([], False)
        for y in outs:
            add(data_of(y))
        variables = [y for y in outs if isinstance(y, chainer.Variable)]
        for node in functions_behind(variables, lambda x: True):
            for x in node.inputs:
                if not isinstance(x.get_variable_or_none(), chainer.Parameter):
                    add(x.data)
        for _, grads in self.weight_work:
            for g in grads:
                add(g)
        return sum(seen.values())


@contextlib.contextmanager
def replaying(state: Any) -> Iterator[None]:
    """Runs the block with NumPy's global random state set to ``state``, and puts
    back the state from before it, even when the block raises."""
    saved = np.random.get_state()
    np.random.set_state(state)
    try:
        yield
    finally:
        np.random.set_state(saved)


def as_list(value: Any) -> Tuple[List[Any], bool]:
    """A component's output as a list, and whether it was a tuple (or list)."""
    if isinstance(value, (tuple, list)):
        return list(value), True
    return [value], False


def data_of(value: Any) -> Any:
    """The array of a Variable; anything else as it is."""
    return value.array if isinstance(value, chainer.Variable) else value


def leaf(array: Any) -> chainer.Variable:
    """A fresh input Variable; it takes a gradient where its dtype is a float."""
    return chainer.Variable(array, requires_grad=array.dtype.kind == "f")
