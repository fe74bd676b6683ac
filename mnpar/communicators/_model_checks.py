"""Checks that every rank holds the same model before gradients or parameters move.

A rank whose parameters or gradients differ would leave its peers waiting in
a collective, or sum mismatched arrays; these checks raise the same
``ValueError`` on every rank instead, naming the difference.
"""
import zlib
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .._arrays import get_array_module, is_cupy_array
from ._wait import wait


def check_same_grads(comm: Any, model: Any, params: List[Any],
                     fingerprints: Dict[Tuple, int]) -> None:
    """Raises on every rank unless all ranks reduce the same gradients (``grad_layout``).

    ``comm`` is the ``Communicator`` that calls this (not imported: it imports
    this module); ``fingerprints`` its cache of layouts' checksums.

    One 16-byte allreduce of a fingerprint per call: a rank with other
    gradients (or none) would otherwise leave its peers waiting in the
    reduction, or sum mismatched arrays. Only on a mismatch do the ranks
    exchange their layouts, to name the difference.
    """
    layout = tuple(grad_layout(p.grad) for p in params)
    fingerprint = fingerprints.get(layout)
    if fingerprint is None:
        if len(fingerprints) > 64:
            fingerprints.clear()
        fingerprint = fingerprints[layout] = zlib.crc32(repr(layout).encode())
    both = np.array([fingerprint, -fingerprint], np.int64)
    wait([comm.private_comm.Iallreduce(MPI.IN_PLACE, both, MPI.MAX)], comm.timeout,
         comm.describe("multi_node_mean_grad", None, None,
                       "every rank to compare its gradients"))
    if both[0] == -both[1]:  # the largest fingerprint is also the smallest
        return
    reduced = {id(p) for p in params}
    named = [(n, grad_layout(p.grad) if id(p) in reduced else "no gradient")
             for n, p in sorted(model.namedparams(), key=lambda item: item[0])]
    check_same_model(comm.allgather_obj(named), "multi_node_mean_grad")
    raise ValueError("multi_node_mean_grad: the gradients differ across ranks")


def check_link(model: Any, op: str) -> None:
    if not callable(getattr(model, "namedparams", None)):
        raise TypeError(f"{op} needs a chainer.Link (a model with parameters), not "
                        f"{type(model).__name__}")


def check_finite(model: Any, params: Sequence[Any]) -> None:
    """Debug mode (``chainer.set_debug(True)``): ``ValueError`` on every rank for a
    gradient that holds NaN or infinity after the mean (the same on every rank)."""
    bad = {id(p) for p in params if not bool(get_array_module(p.grad).isfinite(p.grad).all())}
    if bad:
        names = [n for n, p in model.namedparams() if id(p) in bad]
        raise ValueError(f"multi_node_mean_grad: gradients diverged after the allreduce: NaN "
                         f"or infinity in {names[:5]}")


def grad_layout(grad: Any) -> tuple:
    """What every rank's gradient must share: shape, dtype, and being on a GPU or not."""
    return (grad.shape, str(grad.dtype)) + (("on a GPU",) if is_cupy_array(grad) else ())


def check_same_model(layouts: Sequence[Sequence[Tuple[str, Any]]], op: str) -> None:
    first = layouts[0]
    for rank, other in enumerate(layouts[1:], start=1):
        if other == first:
            continue
        names0, names = dict(first), dict(other)
        diffs = [f"{n!r}: rank 0 has {names0.get(n, 'nothing')}, rank {rank} has "
                 f"{names.get(n, 'nothing')}" for n in sorted(set(names0) | set(names))
                 if names0.get(n) != names.get(n)]
        raise ValueError(f"{op}: the models differ across ranks; " + "; ".join(diffs[:5]))
