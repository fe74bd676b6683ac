"""Empty placeholder arrays: the delegate variables and "phony" inputs.

A delegate variable carries no data, only a place in the graph: it makes one
backward call walk every disconnected piece of a rank's graph in the right
order. A phony input is an empty variable that requires a gradient, so that a
communication node takes part in backward even when none of its real inputs
does (otherwise the peer would wait forever). Both are zero-length float32
arrays on the device of the data they travel with.
"""
from typing import Any, Optional, Sequence, Tuple

import chainer
import numpy as np

from .._arrays import device_of, get_array_module

Spec = Tuple[Tuple[int, ...], Any]  # (shape, dtype) of an array, kept for zero gradients


def empty_like_device(x: Any = None):
    """A zero-length float32 array on the same device as array ``x`` (NumPy if None)."""
    xp = np if x is None else get_array_module(x)
    with device_of(x):
        return xp.empty((0,), np.float32)


def phony(x: Any = None) -> chainer.Variable:
    """A fresh empty variable that requires a gradient, on ``x``'s device."""
    return chainer.Variable(empty_like_device(x))


def data_of(x: Any):
    """The array of a Variable, or ``x`` itself."""
    return x.array if isinstance(x, chainer.Variable) else x


def as_graph_input(delegate: Any, like: Any = None):
    """``delegate`` if it is a variable in a graph, else a fresh phony variable.

    A delegate that does not require a gradient would keep the node out of
    backward, so it is replaced by a phony that does.
    """
    if isinstance(delegate, chainer.Variable) and delegate.requires_grad:
        return delegate
    return phony(like)


def spec_of(a: Any) -> Spec:
    return a.shape, a.dtype


def fill_missing(grads: Sequence[Optional[Any]], specs: Sequence[Spec], xp: Any) -> list:
    """Arrays of ``grads`` (Variables or None); a missing one becomes zeros of its spec."""
    return [xp.zeros(*s) if g is None else g.array for g, s in zip(grads, specs)]


def as_variables(arrays: Sequence[Any]) -> Tuple[chainer.Variable, ...]:
    return tuple(chainer.Variable(a, requires_grad=False) for a in arrays)
