"""Gradient averaging strategies: how each named communicator reduces grads.

This module holds the common machinery and ``naive``/``flat``;
``_hierarchical`` and ``_pure_nccl`` the two others, ``_strategies`` the
table of strategies (a row each: its reducer here, its cost, its options).

The named communicators share one transport and differ only here. Each
averages in two halves: ``start_mean`` posts the reduction, ``finish`` waits
for it and makes the means the gradients. ``multi_node_mean_grad`` calls one
then the other; double buffering calls ``finish`` an update later, so what is
left for it overlaps the next forward and backward:

================  ========================================  ====================
strategy          ``start_mean``                            left for ``finish``
================  ========================================  ====================
``naive``         one allreduce per parameter, in place     wait; times 1/size
``flat``          every gradient of a dtype packed into     wait
                  one buffer, one allreduce
``hierarchical``  inside each node through shared memory    wait; copy the
                  (``_shared_memory``) or, for GPUs, NCCL;  leader's row (GPUs:
                  then one allreduce among node leaders     nothing, as start
                  (GPUs: waited for, as the NCCL broadcast  waited)
                  needs it)
``pure_nccl``     packed on the GPU; one NCCL allreduce     nothing: the stream
                  over all ranks (``_nccl``), launched      orders what follows
================  ========================================  ====================

Packing scales by ``1/size`` in the same pass as the copy, and the reduced
buffer's views become the parameters' gradients, so a packed reduction costs
one copy plus the allreduce. A gradient array stays valid until the next
``multi_node_mean_grad`` on the same communicator (under double buffering,
until the update after next); the parameters' gradients themselves are always
kept correct. A reduction packs into a buffer of its layout (the parameters
and shapes it holds) that no reduction in flight holds: one per layout, two
while double buffering. A changed layout gets a new buffer and drops those not
in flight, so gradients that are still views of the old one are never
overwritten.
"""
from functools import partial
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Set, Tuple, cast

import chainer
import numpy as np
from mpi4py import MPI
from numpy.typing import DTypeLike

from .._arrays import device_of, get_array_module, is_cupy_array, sync_device, to_host
from ._nccl import NcclGroup
from ._topology import Topology
from ._transport import Transport
from ._wait import wait
from ._waiting import Waiting

Layout = Tuple[Any, ...]  # what a packed buffer holds: dtype, where, (id, shape) per parameter


class Param(Protocol):
    """A ``chainer.Parameter`` taking part in a reduction: ``grads_to_reduce`` made sure
    it has data and a gradient (NumPy or cupy arrays), which chainer's own annotations
    call optional and its ``grad`` read-only."""

    data: Any
    grad: Any


# Bytes of one host allreduce; a larger buffer goes as several at once: MPICH runs
# one large non-blocking allreduce far slower than its parts posted together
# (docs/scaling.rst, "Large allreduces in parts").
ALLREDUCE_CHUNK = 2 << 20


def grads_to_reduce(params: Iterable[Tuple[str, chainer.Parameter]],
                    zero_fill: bool) -> List[Param]:
    """The parameters whose gradients take part, in a rank-independent order.

    A parameter without data is skipped; one without a gradient is skipped,
    or with ``zero_fill`` given a zero gradient that takes part.
    """
    out = []
    for _, p in sorted(params, key=lambda item: item[0]):
        param = cast(Param, p)
        if param.data is None:
            continue
        if param.grad is None:
            if not zero_fill:
                continue
            with device_of(param.data):
                param.grad = get_array_module(param.data).zeros_like(param.data)
        out.append(param)
    return out


def _reduce_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == np.float16 else dtype


class PendingMean:
    """A mean of gradients that ``start_mean`` posted and ``finish`` completes.

    ``requests`` are the MPI requests still in flight: a caller that computes
    meanwhile may test them, since MPI moves them only inside MPI calls.
    """

    def __init__(self, params: List[Param]) -> None:
        self.params = params
        self.model: Optional[chainer.Link] = None  # ``params``' link, named in errors
        self.requests: List[MPI.Request] = []
        self.nbytes = 0
        self.completions: List[Callable[[], Any]] = []  # once the requests are done
        self.results: List[Tuple[List[Param], List[Any]]] = []  # groups, means
        self.held: List[int] = []  # ids of the buffers it holds until finished

    def add(self, requests: List[MPI.Request], nbytes: int, group: List[Param],
            views: List[Any], complete: Optional[Callable[[], Any]] = None) -> None:
        """Records one group: its requests, what completes it after them, its means."""
        self.requests += requests
        self.nbytes += nbytes
        if complete is not None:
            self.completions.append(complete)
        self.results.append((group, views))


class FlatReducer:
    """One allreduce over every gradient packed in one buffer: the base strategy,
    which the others refine. Averages the gradients of ``params`` over every
    rank of ``transport``."""

    def __init__(self, transport: Transport, topology: Topology,
                 allreduce_grad_dtype: DTypeLike = None) -> None:
        self.t = transport
        self.topology = topology
        self._buffers: Dict[Layout, List[Any]] = {}  # layout -> its packed buffers
        self._busy: Set[int] = set()  # ids of the buffers that reductions in flight hold
        self._in_flight: List[PendingMean] = []  # started, not finished

    @staticmethod
    def check_config(allreduce_grad_dtype: DTypeLike) -> None:
        """Raises, before any MPI call, where this strategy cannot run here."""

    def start_mean(self, params: List[Param]) -> PendingMean:
        """Starts the mean of the gradients of ``params``; ``finish`` completes it.

        Until then a gradient may be reduced in place (``naive``): the caller
        may replace the gradients but must not write into them.
        """
        pending = PendingMean(params)
        for group in _by_dtype(params).values():
            with device_of(group[0].grad):  # buffers and copies on the gradients' GPU
                self._start_group(group, pending)
        self._in_flight.append(pending)
        return pending

    def finish(self, pending: PendingMean, apply: bool = True) -> None:
        """Waits for ``pending`` (collective); then, with ``apply``, its means become
        the gradients. Without, the reduction only completes (its means are dropped)."""
        if pending in self._in_flight:  # (not where finalize's complete_all finished it)
            self._in_flight.remove(pending)
        wait(pending.requests, self.t.timeout, self._describe(), nbytes=pending.nbytes)
        for complete in pending.completions:
            complete()
        self._busy.difference_update(pending.held)
        if apply:
            for group, views in pending.results:
                _unpack(group, views)

    def _start_group(self, group: List[Param], pending: PendingMean) -> None:
        on_host = not is_cupy_array(group[0].grad) or not self.t.cuda_aware
        buf, views = self._pack(group, on_host, _reduce_dtype(group[0].grad.dtype), pending)
        sync_device(buf)  # on the GPU (cuda_aware), MPI reads it once packed
        pending.add(self._post_packed(buf), buf.nbytes, group, views)

    def _pack(self, group: List[Param], on_host: bool, dtype: DTypeLike,
              pending: PendingMean) -> Tuple[Any, List[Any]]:
        """Copies ``grad / size`` of every parameter into one buffer of ``dtype``.

        The buffer is on the host, or (``on_host`` False) on the current GPU,
        which ``start_mean`` made the gradients' one.
        """
        xp = get_array_module(group[0].grad)
        bxp = np if on_host else xp
        key = (dtype, on_host, tuple((id(p), p.grad.shape) for p in group))
        total = sum(p.grad.size for p in group)
        buf = self._buffer(key, lambda: bxp.empty(total, dtype), pending)
        inv = 1.0 / self.t.size
        views, offset = [], 0
        for p in group:
            n = p.grad.size
            view = buf[offset: offset + n].reshape(p.grad.shape)
            g = to_host(p.grad) if on_host else p.grad
            bxp.multiply(g, inv, out=view, casting="unsafe")
            views.append(view)
            offset += n
        return buf, views

    def _buffer(self, key: Layout, make: Callable[[], Any], pending: PendingMean) -> Any:
        """A buffer of layout ``key`` that no reduction in flight holds, or a new one
        (``make()``); ``pending`` holds it. A new layout drops those not in flight."""
        if key not in self._buffers:
            kept = {k: [b for b in bufs if id(b) in self._busy]
                    for k, bufs in self._buffers.items()}
            self._buffers = {k: bufs for k, bufs in kept.items() if bufs}
        bufs = self._buffers.setdefault(key, [])
        buf = next((b for b in bufs if id(b) not in self._busy), None)
        if buf is None:
            buf = make()
            bufs.append(buf)
        self._hold(buf, pending)
        return buf

    def _hold(self, buf: Any, pending: PendingMean) -> None:
        self._busy.add(id(buf))
        pending.held.append(id(buf))

    def _post_packed(self, buf: Any) -> List[MPI.Request]:
        return self._post(self.t.comm, buf)

    def complete_all(self) -> None:
        """Completes every mean still in flight, dropping it (collective): the
        communicator's ``finalize`` calls it, since an MPI communicator freed
        under a collective in flight breaks the next one made (Open MPI crashes)."""
        for pending in list(self._in_flight):
            self.finish(pending, apply=False)

    def free(self) -> None:
        """Releases what the strategy holds (collective where it shares memory)."""

    # The options of a row of ``_strategies`` (``wire_dtype``, ``nccl``): a strategy
    # whose row has one overrides its method; the table checks that it does.

    def set_wire_dtype(self, allreduce_grad_dtype: DTypeLike) -> None:
        """Changes the dtype gradients travel in (a ``wire_dtype`` strategy's)."""
        raise ValueError("allreduce_grad_dtype is supported by 'pure_nccl' only")

    def nccl_group(self, device: int) -> NcclGroup:
        """The NCCL group of every rank (an ``nccl`` strategy's)."""
        raise ValueError("nccl_sum needs a pure_nccl communicator")

    def _describe(self) -> Waiting:
        return self.t.describe("multi_node_mean_grad", None, None, "every rank's gradients")

    def _post(self, comm: MPI.Comm, buf: Any) -> List[MPI.Request]:
        """Posts the sum over ``comm`` in place, in parts of ``ALLREDUCE_CHUNK`` bytes; its
        requests.

        A GPU buffer (``cuda_aware``) takes a timed barrier and then a blocking
        ``Allreduce``, which leaves no request: CUDA-aware MPIs (Open MPI's
        among them) reduce device memory in blocking collectives only.
        """
        if is_cupy_array(buf):
            wait([comm.Ibarrier()], self.t.timeout, self._describe())
            comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM)
            return []
        flat = buf.reshape(-1)  # a view: buffers and the gradients posted are contiguous
        step = max(1, ALLREDUCE_CHUNK // flat.itemsize)
        return [comm.Iallreduce(MPI.IN_PLACE, flat[i: i + step], MPI.SUM)
                for i in range(0, max(flat.size, 1), step)]

    def _allreduce(self, comm: MPI.Comm, buf: Any) -> None:
        """The sum over ``comm`` in place, waited for under the timeout."""
        wait(self._post(comm, buf), self.t.timeout, self._describe(), nbytes=buf.nbytes)


class NaiveReducer(FlatReducer):
    """One in-place allreduce per parameter."""

    def _start_group(self, group: List[Param], pending: PendingMean) -> None:
        inv = 1.0 / self.t.size
        for p in group:
            g = p.grad
            if isinstance(g, np.ndarray) and g.flags.c_contiguous and g.dtype != np.float16:
                pending.add(self._post(self.t.comm, g), g.nbytes, [p], [g],
                            partial(np.multiply, g, inv, out=g))  # g *= inv, once summed
            else:  # float16, strided or staged GPU gradients go through a buffer
                super()._start_group([p], pending)


def _unpack(group: List[Param], views: List[Any]) -> None:
    """Makes each parameter's gradient its view of a reduced buffer, cast to its data's
    dtype and moved to its data's device where they differ."""
    for p, view in zip(group, views):
        if view.dtype != p.data.dtype or is_cupy_array(p.data) != is_cupy_array(view):
            with device_of(p.data):  # cast where the view is, then at most one copy to the GPU
                p.grad = get_array_module(p.data).asarray(view.astype(p.data.dtype, copy=False))
        else:
            p.grad = view


def _by_dtype(params: List[Param]) -> Dict[Tuple[np.dtype, bool],
                                                        List[Param]]:
    groups: Dict[Tuple[np.dtype, bool], List[Param]] = {}
    for p in params:
        groups.setdefault((p.grad.dtype, is_cupy_array(p.grad)), []).append(p)
    return groups
