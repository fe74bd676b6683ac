"""What crosses a cut, checked at a MultiNodeChainList's first forward.

A component receives arrays from another rank (``rank_in``) and runs its own
layers on them. Pieces built on different ranks may disagree on what the cut
carries: rank 0's piece in float64, rank 1's in float32; or a piece that
sends ``(N, 10)`` to one whose first layer takes ``(N, 20)``. chainer then
refuses the arrays in some function's type check, on the receiving rank,
with an ``InvalidType`` that says nothing of the cut.

What a component takes is known only once it runs (it may cast first, and
under ``mixed16`` its normalisations keep float32 parameters for float16
activations), so nothing is refused beforehand. The check costs nothing
until chainer's own type check fails in the component's first forward;
then, where the failure is about what came through the cut, it becomes a
``WiringError`` naming both ranks, the component and the two dtypes (or the
shape beyond the batch axis and what the function expected)::

    what failed                                 taken for the cut's when
    a dtype check                               a received float array's dtype is
                                                not one of the component's
                                                parameters' (or the function took
                                                the received array itself)
    a shape check                               the function took the received
                                                array itself

Anything else stays chainer's error. No message is added: the received
arrays' dtypes and shapes are those of the message's own header.
"""
from types import TracebackType
from typing import Any, List, Optional, Sequence, Set, Tuple

import chainer
import numpy as np
from chainer.utils.type_check import InvalidType

from .._errors import WiringError

Received = Tuple[int, chainer.Variable]  # (the rank it came from, what arrived)

_APPLY = chainer.FunctionNode.apply.__code__


def received_arrays(rank: int, rank_in: Optional[Sequence[int]],
                    xs: Sequence[Any]) -> List[Received]:
    """What arrived from other ranks among a component's arguments ``xs``."""
    got: List[Received] = []
    for source, x in zip(rank_in or (), xs):
        if source == rank:
            continue
        for v in x if isinstance(x, tuple) else (x,):
            if isinstance(v, chainer.Variable):
                got.append((source, v))
    return got


def cut_error(rank: int, component: int, link: Any, received: Sequence[Received],
              error: InvalidType) -> Optional[WiringError]:
    """The ``WiringError`` that ``error`` (chainer's type check in ``link``) means at the cut,
    or None where it is not about what came through the cut."""
    function, inputs = _failed_function(error.__traceback__)
    direct = [(s, v) for s, v in received if any(a is v.array for a in inputs)]
    name = f"rank {rank} component {component} ({type(link).__name__})"
    check = (f"chainer's type check of {function}: expect {error.expect}, actual "
             f"{error.actual}")
    if "dtype" in str(error.expect):
        params = _float_dtypes(p.array for p in link.params() if p.array is not None)
        foreign = [(s, v) for s, v in received
                   if v.dtype.kind == "f" and params and v.dtype not in params]
        culprits = foreign or direct
        if not culprits:
            return None
        source, v = culprits[0]
        own = (f"its parameters are {_names(params)}" if params else
               f"it computes in {_other_dtype(error.actual, v.dtype)}")
        return WiringError(
            f"{name} receives {v.dtype} from rank {source} through the cut rank {source} -> "
            f"rank {rank}, but {own} ({check}); build both pieces in one dtype (the same "
            f"chainer.config.dtype on every rank) or cast at the cut (F.cast)")
    if not direct:
        return None
    source, v = direct[0]
    return WiringError(
        f"{name} cannot take what rank {source} sends it through the cut rank {source} -> "
        f"rank {rank}: an array of shape {tuple(v.shape)} ({tuple(v.shape[1:])} beyond the "
        f"batch axis), {v.dtype} ({check}); the pieces on both ranks must agree on the shape "
        f"that crosses the cut")


def _failed_function(tb: Optional[TracebackType]) -> Tuple[str, Tuple[Any, ...]]:
    """The innermost FunctionNode whose ``apply`` the traceback passes, and its input
    arrays (its type check is what failed)."""
    name, inputs = "a function", ()
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is _APPLY:
            node = frame.f_locals.get("self")
            name = getattr(node, "label", type(node).__name__)
            inputs = tuple(frame.f_locals.get("in_data") or ())
        tb = tb.tb_next
    return name, inputs


def _float_dtypes(arrays: Any) -> Set[np.dtype]:
    return {a.dtype for a in arrays if a.dtype.kind == "f"}


def _names(dtypes: Set[np.dtype]) -> str:
    return " and ".join(sorted(str(d) for d in dtypes))


def _other_dtype(actual: Any, received: np.dtype) -> str:
    """The dtype of chainer's ``actual`` (``float32 != float64``) that is not ``received``."""
    names = [w for w in str(actual).replace("!=", " ").split() if w != str(received)]
    return names[0] if names else "another dtype"
