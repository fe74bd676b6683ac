"""Array collectives over the transport's private communicator.

Each rank's contribution travels as one self-describing blob (header and
payload, as in point-to-point messages), moved by a variable-length
non-blocking collective: one round for the lengths, one for the blobs.
Received arrays are views of the receive buffer, so nothing is copied twice,
and every wait honours the communicator's timeout. GPU arrays are staged
through host memory here.

``allreduce`` is the exception: it reduces in place with ``Iallreduce`` after
checking, in one small round, that every rank brought the same dtype and shape.
"""
from typing import Any, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .._arrays import as_array_list, cupy_module, is_cupy_array, to_host, unwrap
from . import _message as message
from ._transport import Transport
from ._wait import wait


def _to_blob(data: Any, what: str) -> np.ndarray:
    given, is_tuple = as_array_list(data, what)
    arrays, gpu = message.to_wire(given)
    flags = message.INLINE | (message.TUPLE if is_tuple else 0) | gpu
    return np.frombuffer(message.pack(message.encode(arrays, flags), arrays), np.uint8)


def _from_blob(t: Transport, blob: np.ndarray, sender: int) -> Any:
    header = message.decode(blob)
    arrays = message.restore(message.unpack(blob, header), header.flags, t.rank, sender)
    return unwrap(arrays, bool(header.flags & message.TUPLE))


def _single(x: Any, what: str) -> Any:
    arrays, is_tuple = as_array_list(x, what)
    if is_tuple:
        raise TypeError(f"{what} must be one array, not a {type(x).__name__}")
    return x


def _split(buf: np.ndarray, counts: np.ndarray) -> List[np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return [buf[offsets[i]: offsets[i + 1]] for i in range(len(counts))]


def _vspec(buf: np.ndarray, counts: np.ndarray) -> List[Any]:
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return [buf, (list(map(int, counts)), list(map(int, displs))), MPI.BYTE]


def _wait(t: Transport, reqs: List[MPI.Request], op: str, root: Optional[int] = None,
          nbytes: int = 0) -> None:
    what = "every rank to join" + (f" (root {root})" if root is not None else "")
    wait(reqs, t.timeout, t.describe(op, None, None, what), nbytes=nbytes)


def bcast(t: Transport, data: Any, root: int = 0) -> Any:
    """Rank ``root``'s array (or tuple of arrays) on every rank."""
    root = t.routes.check_peer(root, "root", allow_self=True)
    blob = _to_blob(data, "data") if t.rank == root else None
    n = np.array([blob.size if blob is not None else 0], np.int64)
    _wait(t, [t.comm.Ibcast(n, root)], "bcast", root)
    if blob is None:
        blob = np.empty(int(n[0]), np.uint8)
    _wait(t, [t.comm.Ibcast([blob, MPI.BYTE], root)], "bcast", root, blob.size)
    return _from_blob(t, blob, root)


def gather(t: Transport, x: Any, root: int = 0) -> Optional[Tuple[Any, ...]]:
    """Every rank's array, as a tuple in rank order on ``root``; None elsewhere."""
    root = t.routes.check_peer(root, "root", allow_self=True)
    blob = _to_blob(_single(x, "x"), "x")
    counts = np.zeros(t.size, np.int64)
    _wait(t, [t.comm.Igather(np.array([blob.size], np.int64), counts, root)], "gather", root)
    recv = None
    if t.rank == root:
        buf = np.empty(int(counts.sum()), np.uint8)
        recv = _vspec(buf, counts)
    _wait(t, [t.comm.Igatherv([blob, MPI.BYTE], recv, root)], "gather", root,
          int(counts.sum()))
    if t.rank != root:
        return None
    return tuple(_from_blob(t, b, r) for r, b in enumerate(_split(buf, counts)))


def scatter(t: Transport, xs: Any, root: int = 0) -> Any:
    """Rank ``root``'s ``xs[i]`` on rank ``i``.

    ``xs`` is a tuple/list of ``size`` arrays, or one array whose first axis
    has length ``size``; it is ignored on other ranks.
    """
    root = t.routes.check_peer(root, "root", allow_self=True)
    send = None
    counts = np.zeros(t.size, np.int64)
    if t.rank == root:
        parts = list(xs) if isinstance(xs, (tuple, list)) or hasattr(xs, "shape") else None
        if parts is None:
            raise TypeError(f"xs must be a tuple/list of arrays or an array, "
                            f"not {type(xs).__name__}")
        if len(parts) != t.size:
            raise ValueError(f"scatter needs one part per rank: got {len(parts)} parts "
                             f"for a communicator of size {t.size}")
        blobs = [_to_blob(_single(p, f"xs[{i}]"), f"xs[{i}]") for i, p in enumerate(parts)]
        counts[:] = [b.size for b in blobs]
        send = _vspec(np.concatenate(blobs), counts)
    n = np.zeros(1, np.int64)
    _wait(t, [t.comm.Iscatter(counts, n, root)], "scatter", root)
    blob = np.empty(int(n[0]), np.uint8)
    _wait(t, [t.comm.Iscatterv(send, [blob, MPI.BYTE], root)], "scatter", root,
          int(counts.sum()) or blob.size)
    return _from_blob(t, blob, root)


def allgather(t: Transport, x: Any) -> Tuple[Any, ...]:
    """Every rank's array, as a tuple in rank order, on every rank."""
    blobs = _allgather_blobs(t, _to_blob(_single(x, "x"), "x"))
    return tuple(_from_blob(t, b, r) for r, b in enumerate(blobs))


def _allgather_blobs(t: Transport, blob: np.ndarray, op: str = "allgather") -> List[np.ndarray]:
    counts = np.zeros(t.size, np.int64)
    _wait(t, [t.comm.Iallgather(np.array([blob.size], np.int64), counts)], op)
    buf = np.empty(int(counts.sum()), np.uint8)
    _wait(t, [t.comm.Iallgatherv([blob, MPI.BYTE], _vspec(buf, counts))], op,
          nbytes=buf.size)
    return _split(buf, counts)


def alltoall(t: Transport, xs: Any) -> Tuple[Any, ...]:
    """``xs[j]`` of rank ``i`` becomes element ``i`` of the result on rank ``j``."""
    if not isinstance(xs, (tuple, list)) or len(xs) != t.size:
        got = len(xs) if isinstance(xs, (tuple, list)) else type(xs).__name__
        raise ValueError(f"alltoall needs a tuple/list of one array per rank ({t.size}), "
                         f"got {got}")
    blobs = [_to_blob(_single(x, f"xs[{i}]"), f"xs[{i}]") for i, x in enumerate(xs)]
    send_counts = np.array([b.size for b in blobs], np.int64)
    recv_counts = np.zeros(t.size, np.int64)
    _wait(t, [t.comm.Ialltoall(send_counts, recv_counts)], "alltoall")
    buf = np.empty(int(recv_counts.sum()), np.uint8)
    _wait(t, [t.comm.Ialltoallv(_vspec(np.concatenate(blobs), send_counts),
                                _vspec(buf, recv_counts))], "alltoall", nbytes=buf.size)
    return tuple(_from_blob(t, b, r) for r, b in enumerate(_split(buf, recv_counts)))


def allreduce(t: Transport, x: Any) -> Any:
    """The elementwise sum of every rank's array, on every rank."""
    x = _single(x, "x")
    if x.dtype.kind == "b":
        raise TypeError("allreduce sums arrays; a bool array cannot be summed "
                        "(cast it to an integer dtype)")
    check_same_layout(t, x, "allreduce")
    gpu = is_cupy_array(x)
    host = to_host(x)
    # MPI has no portable float16 sum: add in float32, then cast back.
    work = host.astype(np.float32) if host.dtype == np.float16 else host.copy()
    work = np.ascontiguousarray(work)
    _wait(t, [t.comm.Iallreduce(MPI.IN_PLACE, work, MPI.SUM)], "allreduce",
          nbytes=work.nbytes)
    out = work.astype(host.dtype, copy=False)
    return cupy_module().asarray(out) if gpu else out


def check_same_layout(t: Transport, x: Any, op: str) -> None:
    """Raises ValueError on every rank unless all ranks hold one dtype and shape."""
    mine = message.encode([x], 0)
    blobs = _allgather_blobs(t, np.frombuffer(mine, np.uint8), op)
    if all(b.tobytes() == mine for b in blobs):
        return
    layouts = [message.decode(b).specs[0] for b in blobs]
    listing = ", ".join(f"rank {r}: {d} {s}" for r, (d, s) in enumerate(layouts))
    raise ValueError(f"{op} needs the same dtype and shape on every rank; got {listing}")
