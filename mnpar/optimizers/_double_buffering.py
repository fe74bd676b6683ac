"""Double buffering: the allreduce of step k overlaps the compute of step k+1.

Each update starts the mean of its gradients with the communicator's own
strategy (``start_mean_grad``: the check that every rank reduces the same
gradients, then the reducer's start), finishes the mean the update before
started, and applies that one::

    update  starts          finishes and applies (one step stale)
    1       mean of step 1  nothing (or only the broadcast)
    2       mean of step 2  mean of step 1
    3       mean of step 3  mean of step 2

What stays in flight between two updates is the strategy's (``_reducers``):
``naive`` and ``flat`` their allreduces; ``hierarchical`` the node leaders'
allreduce, the phase inside the node being done at the start; ``pure_nccl``
nothing the host waits for. The reducer packs step k+1 into a second buffer
while the first is still reduced. The gradients the wrapped optimizer sees
belong to the step before, and are views of a buffer that is rewritten two
updates later. The gradients of the last step are never applied (``flush``
applies them).

MPI progresses a non-blocking collective only inside MPI calls. So while
``update(lossfun, ...)`` runs the next forward and backward, a function hook
tests the requests after every function node: the reduction advances between
the step's layers without a progress thread. (Gradients computed before
``update()`` is called get no such help.)
"""
from typing import Any, List, Optional, Set

import chainer
from mpi4py import MPI

from ..communicators._facade import Communicator, PendingMean, require_communicator
from ._multi_node import MultiNodeOptimizer


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

    _own = MultiNodeOptimizer._own + ("_in_flight",)

    def __init__(self, actual_optimizer: chainer.Optimizer, communicator: Communicator,
                 zero_fill: bool) -> None:
        super().__init__(actual_optimizer, communicator, zero_fill)
        require_communicator(communicator, "double_buffering")
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
            dropped = self._swap(None)
            if dropped is not None:  # gradients of other parameters: never applied
                self.communicator.finish_mean_grad(dropped, apply=False)
        return changed

    def _average_and_update(self, target: chainer.Link) -> None:
        # Start first: the previous step's buffer is still held, so this step
        # packs into the other one.
        ready = self._swap(self.communicator.start_mean_grad(target, self.zero_fill))
        applied: Set[int] = set()
        if ready is not None:
            self.communicator.finish_mean_grad(ready)
            applied = {id(p) for p in ready.params}
        for p in self._in_flight.params:
            if id(p) not in applied:  # its mean comes next update (naive reduces it in place)
                p.grad = None
        if ready is not None:
            self.actual_optimizer.update(None)

    def flush(self) -> None:
        """Waits for the gradients in flight and applies them (one more update)."""
        ready = self._swap(None)
        if ready is not None:
            self.communicator.finish_mean_grad(ready)
            self.actual_optimizer.update(None)

    def _swap(self, pending: Optional[PendingMean]) -> Optional[PendingMean]:
        """Puts ``pending`` in flight; returns the mean it replaces (None if none)."""
        previous = self._in_flight
        object.__setattr__(self, "_in_flight", pending)
        return previous
