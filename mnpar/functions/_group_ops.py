"""The array collectives of tensor parallelism: sum, gather and reduce-scatter along an axis.

Tensor parallelism calls these at every layer, so each is one non-blocking
MPI collective on the communicator's private duplicate, after one small
round that proves every rank brought arrays that fit together:

===============  ================================  ================================
operation        the check (one small collective)  the data
===============  ================================  ================================
``sum_of``       16 bytes: the largest fingerprint  ``Iallreduce`` in place
                 of (shape, dtype) is the smallest
``gather``       every rank's extent along the      ``Iallgatherv``; the parts
                 axis and the fingerprint of the    joined along the axis
                 rest (``Iallgather`` of 2 ints)
``reduce_``      as ``sum_of``                      ``Ireduce_scatter``, counts from
``scatter``                                         the bounds of each rank's part
===============  ================================  ================================

A mismatch makes every rank exchange its layout and raise the same
``ValueError``, never a hang or a sum of arrays that do not match. Parts
travel as the axis moved first (contiguous), so uneven extents cost
nothing extra. GPU arrays go through NCCL where the communicator is
``pure_nccl`` (a gather and a reduce-scatter as a sum of zero-padded parts,
exact: adding zeros changes no bit), else they are staged through host memory.
float16 is summed in float32, as the communicators do.
"""
import zlib
from typing import Any, List, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .._arrays import cupy_module, device_of, get_array_module, is_cupy_array, to_host
from ..communicators._facade import Communicator, wait

Bounds = Tuple[int, ...]  # bounds[r]:bounds[r + 1] is rank r's part; bounds[-1] the total


def _fingerprint(layout: Any) -> int:
    return zlib.crc32(repr(layout).encode())


def _layout(x: Any) -> tuple:
    return tuple(x.shape), str(x.dtype), is_cupy_array(x)


def _wait(comm: Communicator, reqs: List[Any], op: str, nbytes: int = 0) -> None:
    wait(reqs, comm.timeout, comm.describe(op, None, None, "every rank of the group"),
         nbytes=nbytes)


def _refuse(comm: Communicator, op: str, mine: Any, what: str) -> ValueError:
    layouts = comm.allgather_obj(mine)
    listing = ", ".join(f"rank {r}: {_describe(lay)}" for r, lay in enumerate(layouts))
    return ValueError(f"{op} needs {what} on every rank of its group; got {listing}")


def _describe(layout: Any) -> str:
    shape, dtype, gpu = layout
    return f"{dtype} {tuple(shape)}" + (" on a GPU" if gpu else "")


def check_same(comm: Communicator, layout: Any, op: str, what: str) -> None:
    """Raises on every rank unless all ranks hold ``layout`` (one 16-byte allreduce)."""
    fp = _fingerprint(layout)
    both = np.array([fp, -fp], np.int64)
    _wait(comm, [comm.private_comm.Iallreduce(MPI.IN_PLACE, both, MPI.MAX)], op)
    if both[0] != -both[1]:
        raise _refuse(comm, op, layout, what)


def _nccl(comm: Communicator, x: Any) -> bool:
    return comm.strategy.nccl and is_cupy_array(x)


def _host_work(x: Any) -> np.ndarray:
    host = to_host(x)
    work = host.astype(np.float32) if host.dtype == np.float16 else host
    return np.ascontiguousarray(work)


def _back(work: np.ndarray, like: Any) -> Any:
    out = work.astype(like.dtype, copy=False)
    if is_cupy_array(like):
        with device_of(like):
            return cupy_module().asarray(out)
    return out


def sum_of(comm: Communicator, x: Any, op: str) -> Any:
    """The elementwise sum of every rank's ``x`` (a new array), on every rank."""
    if comm.size == 1:
        return x.copy()
    check_same(comm, _layout(x), op, "arrays of one shape and dtype")
    if _nccl(comm, x):
        work = x.astype(np.float32) if x.dtype == np.float16 else x.copy()
        comm.nccl_sum(work)
        return work.astype(x.dtype, copy=False)
    work = _host_work(x)
    work = work.copy() if work is x else work
    _wait(comm, [comm.private_comm.Iallreduce(MPI.IN_PLACE, work, MPI.SUM)], op, work.nbytes)
    return _back(work, x)


def max_of(comm: Communicator, x: Any, op: str) -> Any:
    """The elementwise maximum of every rank's ``x`` (a new array), on every rank."""
    if comm.size == 1:
        return x.copy()
    check_same(comm, _layout(x), op, "arrays of one shape and dtype")
    work = _host_work(x)
    work = work.copy() if work is x else work
    _wait(comm, [comm.private_comm.Iallreduce(MPI.IN_PLACE, work, MPI.MAX)], op, work.nbytes)
    return _back(work, x)


def _front(x: Any, axis: int) -> Any:
    """``x`` with ``axis`` first, contiguous."""
    xp = get_array_module(x)
    return xp.ascontiguousarray(xp.moveaxis(x, axis, 0))


def bounds_of(extents: Sequence[int]) -> Bounds:
    return tuple(int(b) for b in np.concatenate([[0], np.cumsum(extents)]))


def gather(comm: Communicator, x: Any, axis: int, op: str) -> Tuple[Any, Bounds]:
    """Every rank's ``x`` joined along ``axis`` in rank order, and the parts' bounds.

    The other axes and the dtype must agree (checked in the same round as
    the extents).
    """
    if comm.size == 1:
        return x, (0, x.shape[axis])
    rest = tuple(n for i, n in enumerate(x.shape) if i != axis)
    layout = (rest, str(x.dtype), is_cupy_array(x))
    mine = np.array([x.shape[axis], _fingerprint(layout)], np.int64)
    every = np.zeros((comm.size, 2), np.int64)
    _wait(comm, [comm.private_comm.Iallgather(mine, every)], op)
    if len(set(every[:, 1].tolist())) > 1:
        raise _refuse(comm, op, ((-1,) + rest, str(x.dtype), is_cupy_array(x)),
                      f"arrays that differ along axis {axis} alone (shown as -1)")
    extents = [int(e) for e in every[:, 0]]
    bounds = bounds_of(extents)
    front = _front(x, axis)
    xp = get_array_module(x)
    per = int(np.prod(rest, dtype=np.int64))
    if _nccl(comm, x):
        r = comm.rank
        work = xp.zeros((bounds[-1],) + front.shape[1:],
                        np.float32 if x.dtype == np.float16 else x.dtype)
        work[bounds[r]:bounds[r + 1]] = front
        comm.nccl_sum(work)
        whole = work.astype(x.dtype, copy=False)
    else:
        host = np.ascontiguousarray(to_host(front))
        out = np.empty((bounds[-1],) + front.shape[1:], host.dtype)
        counts = [e * per for e in extents]
        displs = [b * per for b in bounds[:-1]]
        _wait(comm, [comm.private_comm.Iallgatherv(host, [out, (counts, displs)])], op,
              out.nbytes)
        whole = _back(out, x)
    return xp.ascontiguousarray(xp.moveaxis(whole, 0, axis)), bounds


def reduce_scatter(comm: Communicator, x: Any, axis: int, bounds: Bounds, rank: int,
                   op: str) -> Any:
    """This rank's part (``bounds``) along ``axis`` of the sum of every rank's ``x``."""
    if comm.size == 1:
        return x.copy()
    check_same(comm, _layout(x), op, "arrays of one shape and dtype")
    xp = get_array_module(x)
    front = _front(x, axis)
    if _nccl(comm, x):
        work = front.astype(np.float32) if x.dtype == np.float16 else front
        comm.nccl_sum(work)
        mine = work[bounds[rank]:bounds[rank + 1]].astype(x.dtype, copy=False)
    else:
        work = _host_work(front)
        per = int(np.prod(work.shape[1:], dtype=np.int64))
        counts = [(bounds[r + 1] - bounds[r]) * per for r in range(comm.size)]
        out = np.empty((bounds[rank + 1] - bounds[rank],) + work.shape[1:], work.dtype)
        _wait(comm, [comm.private_comm.Ireduce_scatter(work, out, counts, MPI.SUM)], op,
              work.nbytes)
        mine = _back(out, x)
    return xp.ascontiguousarray(xp.moveaxis(mine, 0, axis))


def balanced(total: int, parts: int, unit: int = 1) -> Bounds:
    """Bounds of ``parts`` parts of ``total`` in whole units, the first ones a unit longer
    where they do not divide evenly (``numpy.array_split``'s rule)."""
    units, extra = divmod(total // unit, parts)
    extents = [(units + (r < extra)) * unit for r in range(parts)]
    return bounds_of(extents)


def part(x: Any, axis: int, bounds: Bounds, rank: int) -> Any:
    """Rank ``rank``'s part of ``x`` along ``axis`` (a contiguous copy)."""
    xp = get_array_module(x)
    index = [slice(None)] * x.ndim
    index[axis] = slice(bounds[rank], bounds[rank + 1])
    return xp.ascontiguousarray(x[tuple(index)])
