"""Double buffering: the allreduce of step k overlaps the compute of step k+1.

Two packed buffers per dtype take turns; each update waits for the one in
flight, posts the other, and applies the finished one::

    update  packs into  posts            applies (one step stale)
    1       A           Iallreduce(A)    nothing (or only the broadcast)
    2       B           Iallreduce(B)    mean of step 1's gradients (A)
    3       A           Iallreduce(A)    mean of step 2's gradients (B)

The reduction is one non-blocking ``Iallreduce`` per dtype on the
communicator's private MPI communicator, whatever its name; the mean is
packed (scaled by ``1/size``) in the copy. The gradients the wrapped
optimizer sees are views of a buffer that is rewritten two updates later;
they belong to the step before. The gradients of the last step are never
applied (``flush`` applies them).

MPI progresses a non-blocking collective only inside MPI calls. So while
``update(lossfun, ...)`` runs the next forward and backward, a function hook
tests the request after every function node: the reduction advances between
the step's layers without a progress thread. (Gradients computed before
``update()`` is called get no such help.)
"""
from typing import Any, Dict, List, Optional, Tuple

import chainer
import numpy as np
from mpi4py import MPI

from .._arrays import cupy_module, device_of, is_cupy_array, to_host
from ..communicators._communicator import require_communicator
from ..communicators._wait import wait
from ._multi_node import MultiNodeOptimizer, params_to_reduce

Group = Tuple[List[Any], np.ndarray]


def _wire_dtype(dtype: np.dtype) -> np.dtype:
    """MPI has no portable float16 sum: reduce float16 in float32."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


class _InFlight:
    """One posted allreduce: its requests and the packed groups it reduces."""

    def __init__(self, requests: List[MPI.Request], groups: List[Group], nbytes: int) -> None:
        self.requests = requests
        self.groups = groups
        self.nbytes = nbytes


class _Progress(chainer.FunctionHook):
    """Tests the requests in flight after every function node, so MPI moves them."""

    name = "mnpar_allreduce_progress"

    def __init__(self, requests: List[MPI.Request]) -> None:
        self.requests = requests
        self.done = False

    def _poke(self) -> None:
        if not self.done:
            self.done = MPI.Request.Testall(self.requests)

    def forward_postprocess(self, function: Any, in_data: Any) -> None:
        self._poke()

    def backward_postprocess(self, function: Any, in_data: Any, out_grad: Any) -> None:
        self._poke()


class DoubleBufferingOptimizer(MultiNodeOptimizer):
    """A multi-node optimizer whose updates apply the previous step's mean gradients.

    Create one with ``create_multi_node_optimizer(..., double_buffering=True)``.
    """

    _own = MultiNodeOptimizer._own + ("_buffers", "_side", "_in_flight")

    def __init__(self, actual_optimizer: chainer.Optimizer, communicator: Any,
                 zero_fill: bool) -> None:
        super().__init__(actual_optimizer, communicator, zero_fill)
        require_communicator(communicator, "double_buffering")
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_side", 0)
        object.__setattr__(self, "_in_flight", None)

    def update(self, lossfun: Any = None, *args: Any, **kwds: Any) -> None:
        """Computes gradients (if ``lossfun`` is given) while the previous step's
        allreduce progresses, then applies that step's mean gradients; collective."""
        if self._in_flight is None or lossfun is None:
            return super().update(lossfun, *args, **kwds)
        with _Progress(self._in_flight.requests):
            super().update(lossfun, *args, **kwds)

    def _layout_changed(self, target: chainer.Link) -> bool:
        changed = super()._layout_changed(target)
        if changed:
            self._finish()  # gradients of other parameters: never applied
            object.__setattr__(self, "_buffers", {})
        return changed

    def _average_and_update(self, target: chainer.Link) -> None:
        ready = self._finish()
        self._post(params_to_reduce(target, self.zero_fill))
        if ready is None:
            return
        self._apply(ready)
        self.actual_optimizer.update(None)

    def flush(self) -> None:
        """Waits for the gradients in flight and applies them (one more update)."""
        ready = self._finish()
        if ready is not None:
            self._apply(ready)
            self.actual_optimizer.update(None)

    def _post(self, params: List[Any]) -> None:
        comm = self.communicator
        groups: Dict[Any, List[Any]] = {}
        for p in params:
            groups.setdefault(_wire_dtype(p.grad.dtype), []).append(p)
        packed, requests, nbytes = [], [], 0
        inv = 1.0 / comm.size
        for dtype, group in groups.items():
            buf = self._buffer(dtype, group)
            offset = 0
            for p in group:
                n = p.grad.size
                g = to_host(p.grad)
                np.multiply(g, inv, out=buf[offset: offset + n].reshape(g.shape),
                            casting="unsafe")
                offset += n
            requests.append(comm.private_comm.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM))
            packed.append((group, buf))
            nbytes += buf.nbytes
        object.__setattr__(self, "_side", 1 - self._side)
        object.__setattr__(self, "_in_flight", _InFlight(requests, packed, nbytes))

    def _buffer(self, dtype: np.dtype, group: List[Any]) -> np.ndarray:
        """This turn's buffer for ``dtype``; the other one may still be in use."""
        key = (dtype, tuple((id(p), p.grad.shape) for p in group))
        pair = self._buffers.get(key)
        if pair is None:
            total = sum(p.grad.size for p in group)
            pair = self._buffers[key] = (np.empty(total, dtype), np.empty(total, dtype))
        return pair[self._side]

    def _finish(self) -> Optional[List[Group]]:
        """Waits for the allreduce in flight; its groups, or None if none was posted."""
        flight = self._in_flight
        if flight is None:
            return None
        object.__setattr__(self, "_in_flight", None)
        comm = self.communicator
        wait(flight.requests, comm.timeout,
             comm.describe("double-buffered multi_node_mean_grad", None, None,
                           "every rank's gradients of the previous step"),
             nbytes=flight.nbytes)
        return flight.groups

    @staticmethod
    def _apply(groups: List[Group]) -> None:
        """Makes each parameter's gradient its part of the reduced buffer."""
        for group, buf in groups:
            offset = 0
            for p in group:
                n = p.data.size
                view = buf[offset: offset + n].reshape(p.data.shape)
                offset += n
                if is_cupy_array(p.data):
                    with device_of(p.data):  # cast on the host, one upload to its GPU
                        p.grad = cupy_module().asarray(view.astype(p.data.dtype, copy=False))
                elif view.dtype != p.data.dtype:
                    p.grad = view.astype(p.data.dtype)
                else:
                    p.grad = view
