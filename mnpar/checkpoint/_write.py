"""Writing a checkpoint: every rank its own file at once, the index last, then the name.

::

    rank 0: final name free? make .NAME.tmp-XXXX      (broadcast to every rank)
    every rank: write shard-<rank>-of-<size>.bin, fsync  (in parallel, no messages)
    gather each rank's list of pieces (or its error) on rank 0
    rank 0: check that every array's pieces are disjoint and cover it, write index.json,
            fsync, rename .NAME.tmp-XXXX -> NAME, fsync the parent   (broadcast: done or why not)

A rank that fails while writing (a full disk, a directory it cannot see)
reports its error in the gather instead of leaving the others waiting: the
temporary directory is removed and every rank raises the same
``CheckpointError``. A rank that dies leaves a temporary directory and no
checkpoint of that name, so the newest complete one is still the newest
name. An existing checkpoint is never written over.
"""
import os
import secrets
import shutil
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .._arrays import to_host
from ._errors import CheckpointError
from ._format import FORMAT, VERSION, Piece, crc32, shard_file, write_index
from ._holdings import Holdings


def temporary_name(path: str, token: str) -> str:
    parent, base = os.path.split(os.path.abspath(path))
    return os.path.join(parent, f".{base}.tmp-{token}")


def is_temporary(name: str) -> bool:
    return name.startswith(".") and ".tmp-" in name


def _value_array(value: Any) -> Tuple[Optional[np.ndarray], bool]:
    """A value as an array (None: ``(None, True)``)."""
    if value is None:
        return None, True
    a = to_host(value) if hasattr(value, "device") and not isinstance(value, np.ndarray) \
        else np.asarray(value)
    if a.dtype.kind == "O":
        raise CheckpointError(f"a value of type {type(value).__name__} cannot be saved as "
                              "an array (an object array)")
    return a, False


def write_rank_file(directory: str, rank: int, size: int, h: Holdings) -> Dict[str, Any]:
    """Writes this rank's pieces; returns their description for the index."""
    name = shard_file(rank, size)
    parts, values = [], []
    offset = 0
    with open(os.path.join(directory, name), "wb") as f:
        def put(a: np.ndarray) -> Piece:
            nonlocal offset
            a = np.ascontiguousarray(a)
            f.write(a.reshape(-1).view(np.uint8).data if a.size else b"")
            piece = Piece(name, offset, int(a.nbytes), crc32(a), None, (0, int(a.size)))
            offset += int(a.nbytes)
            return piece
        for part in h.parts:
            if not part.writes:
                continue
            data = to_host(part.array).reshape(-1)
            if data.dtype != part.dtype:
                raise CheckpointError(f"{part.name!r}: this rank holds {data.dtype}, not "
                                      f"{part.dtype}")
            piece = put(data)._replace(box=part.box, flat=part.flat)
            parts.append((part.name, list(part.shape), part.dtype.str, piece.to_json()))
        for key, held in sorted(h.values.items()):
            try:
                a, none = _value_array(held.value)
            except CheckpointError as e:
                raise CheckpointError(f"{key!r}: {e}") from None
            arr = np.zeros(0, np.uint8) if a is None else a
            piece = put(arr)
            values.append((key, arr.dtype.str, list(arr.shape), none, piece.to_json()))
        f.flush()
        os.fsync(f.fileno())
    return {"file": name, "bytes": offset, "parts": parts, "values": values,
            "layout": "; ".join(h.layout)}


def build_index(reports: List[Dict[str, Any]], iteration: Optional[int]) -> Dict[str, Any]:
    """The index of the ranks' reports; ``CheckpointError`` for pieces that disagree,
    overlap or leave part of an array unwritten."""
    arrays: Dict[str, Dict[str, Any]] = {}
    owners: Dict[str, List[Tuple[int, Piece]]] = {}
    values: Dict[str, List[Dict[str, Any]]] = {}
    for rank, report in enumerate(reports):
        for name, shape, dtype, piece in report["parts"]:
            entry = arrays.setdefault(name, {"shape": shape, "dtype": dtype, "pieces": []})
            if (entry["shape"], entry["dtype"]) != (shape, dtype):
                first = owners[name][0][0]
                raise CheckpointError(
                    f"array {name!r}: rank {first} holds it as {entry['dtype']} "
                    f"{tuple(entry['shape'])}, rank {rank} as {dtype} {tuple(shape)}")
            entry["pieces"].append(piece)
            owners.setdefault(name, []).append((rank, Piece.from_json(piece)))
        for name, dtype, shape, none, piece in report["values"]:
            copies = values.setdefault(name, [])
            same = next((c for c in copies if (c["dtype"], c["shape"], c["none"],
                                               c["piece"]["crc32"]) ==
                         (dtype, shape, none, piece["crc32"])), None)
            if same is None:
                copies.append({"ranks": [rank], "dtype": dtype, "shape": shape, "none": none,
                               "piece": piece})
            else:
                same["ranks"].append(rank)
    for name, entry in arrays.items():
        check_cover(name, tuple(entry["shape"]), owners[name])
    return {"format": FORMAT, "version": VERSION, "ranks": len(reports), "iteration": iteration,
            "layout": [r["layout"] for r in reports],
            "files": {r["file"]: r["bytes"] for r in reports}, "arrays": arrays,
            "values": values}


def check_cover(name: str, shape: Tuple[int, ...], pieces: List[Tuple[int, Piece]]) -> None:
    """``CheckpointError`` unless ``pieces`` are disjoint and cover an array of ``shape``."""
    size = int(np.prod(shape))
    total = 0
    for i, (rank, p) in enumerate(pieces):
        total += p.flat[1] - p.flat[0]
        for other_rank, q in pieces[:i]:
            if _overlap(p, q, shape):
                raise CheckpointError(
                    f"array {name!r}: ranks {other_rank} and {rank} both write elements "
                    f"{_where(q)} and {_where(p)}; every element must be written once (declare "
                    "replicas: the data-parallel optimizer, or mnpar_replicas() of a link)")
    if total != size:
        raise CheckpointError(f"array {name!r} of shape {shape}: the ranks write {total} of "
                              f"its {size} elements")


def _where(p: Piece) -> str:
    box = "" if p.box is None else f"block {p.box}, "
    return f"{box}flat {list(p.flat)}"


def _overlap(p: Piece, q: Piece, shape: Tuple[int, ...]) -> bool:
    if p.flat[0] == p.flat[1] or q.flat[0] == q.flat[1]:
        return False
    pb = p.box or [(0, s) for s in shape]
    qb = q.box or [(0, s) for s in shape]
    if pb == qb:
        return p.flat[0] < q.flat[1] and q.flat[0] < p.flat[1]
    return all(a0 < b1 and b0 < a1 for (a0, a1), (b0, b1) in zip(pb, qb))


def save(path: str, comm: Any, h: Holdings, iteration: Optional[int]) -> str:
    """Writes ``h`` of every rank of ``comm`` as the checkpoint ``path``; collective."""
    plan: Any = None
    if comm.rank == 0:
        if os.path.exists(path):
            plan = f"{path!r} exists already; a checkpoint is never written over"
        else:
            tmp = temporary_name(path, secrets.token_hex(4))
            try:
                os.makedirs(tmp)
                plan = ("ok", tmp)
            except OSError as e:
                plan = f"cannot make {tmp!r}: {e}"
    plan = comm.bcast_obj(plan, root=0)
    if isinstance(plan, str):
        raise CheckpointError(f"save: {plan}")
    tmp = plan[1]
    try:
        report: Any = write_rank_file(tmp, comm.rank, comm.size, h)
    except (OSError, CheckpointError) as e:
        report = f"rank {comm.rank}: {e}"
    reports = comm.gather_obj(report, root=0)
    outcome: Any = "ok"
    if comm.rank == 0:
        outcome = _commit(path, tmp, reports, iteration)
    outcome = comm.bcast_obj(outcome, root=0)
    if outcome != "ok":
        raise CheckpointError(f"save {path!r}: {outcome}")
    return path


def _commit(path: str, tmp: str, reports: List[Any], iteration: Optional[int]) -> str:
    failed = [r for r in reports if isinstance(r, str)]
    try:
        if failed:
            return failed[0]
        write_index(tmp, build_index(reports, iteration))
        os.rename(tmp, path)
    except (OSError, CheckpointError) as e:
        return str(e)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    fsync_directory(os.path.dirname(os.path.abspath(path)))
    return "ok"


def fsync_directory(directory: str) -> None:
    """Makes a rename in ``directory`` durable; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
