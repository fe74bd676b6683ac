"""Reading a checkpoint into any layout: each rank reads the pieces its parts overlap.

A load runs in three phases, each ended by every rank agreeing (one
``allgather``) that nobody failed, so a refusal is the same ``CheckpointError``
on every rank and nothing is written into the model before everything is read::

    check   every part and value this rank needs is in the index, with its shape and
            dtype; every file it will read is there, of its full size; a value the
            saving ranks held differently goes only to the same rank count
    read    the pieces into new arrays, each checked against its CRC-32
    assign  parameters, optimizer state and values, in place

A part is assembled from the pieces that overlap it: flat ranges of the same
block are copied directly; blocks against flat ranges go through the
elements' global positions.
"""
import fnmatch
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from chainer.serializers import NpzDeserializer

from .._arrays import is_cupy_array
from ._errors import CheckpointError
from ._format import Array, Box, Copy, Index, Piece, crc32
from ._holdings import Holdings, Part

# Values the ranks hold differently where rank 0's copy will do at any rank count: the
# time the run has taken (each rank measures its own).
ANY_COPY = ("trainer/_snapshot_elapsed_time",)


def excluded(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def check(index: Index, h: Holdings, rank: int, size: int,
          exclude: Sequence[str]) -> Optional[str]:
    """Why this rank cannot load ``index`` into ``h`` (None: it can)."""
    for part in h.parts:
        if excluded(part.name, exclude):
            continue
        entry = index.arrays.get(part.name)
        if entry is None:
            return f"the checkpoint has no array {part.name!r}{_near(index, part.name)}"
        if entry.shape != part.shape or entry.dtype != part.dtype:
            return (f"array {part.name!r} is {entry.dtype} {entry.shape} in the checkpoint, "
                    f"{part.dtype} {part.shape} here: a checkpoint of another model, or names "
                    "that place this model's links elsewhere")
        for piece in _overlapping(entry, part):
            problem = _file_problem(index, piece, part.name)
            if problem:
                return problem
    for name, held in sorted(h.values.items()):
        if excluded(name, exclude):
            continue
        copy = choose(index, name, rank, size)
        if isinstance(copy, str):
            return copy
        if isinstance(held.value, np.ndarray) and not copy.none and \
                tuple(held.value.shape) != copy.shape:
            return (f"value {name!r} has shape {copy.shape} in the checkpoint, "
                    f"{tuple(held.value.shape)} here")
        problem = _file_problem(index, copy.piece, name)
        if problem:
            return problem
    return None


def unclaimed(index: Index, asked: List[List[str]], exclude: Sequence[str]) -> Optional[str]:
    """Why the arrays of the checkpoint that no rank asks for make a refusal (None if all
    are asked for)."""
    wanted = set().union(*map(set, asked))
    left = sorted(n for n in index.arrays if n not in wanted and not excluded(n, exclude))
    if not left:
        return None
    return (f"the checkpoint's array {left[0]!r} (and {len(left) - 1} more) is part of no "
            f"rank's model here: a checkpoint of another model, or a model split another way "
            f"without names= that place its links (saved by {index.describe()})")


def choose(index: Index, name: str, rank: int, size: int) -> Any:
    """The copy of value ``name`` for this rank, or why there is none."""
    copies = index.values.get(name)
    if not copies:
        return f"the checkpoint has no value {name!r}{_near(index, name)}"
    if len(copies) == 1:
        return copies[0]
    if name in ANY_COPY:
        return min(copies, key=lambda c: min(c.ranks))
    if index.ranks == size:
        return next(c for c in copies if rank in c.ranks)
    held = "; ".join(f"ranks {c.ranks}" for c in copies)
    return (f"value {name!r} was held differently by the {index.ranks} ranks that wrote it "
            f"({held}), so it cannot be given to {size} ranks: it is rank-local state (an "
            "iterator over each rank's own shard of the data, say), which loads only at the "
            "rank count that wrote it. Use an iterator that every rank shares (one order over "
            "the whole dataset, each rank taking its rows of the global batch), or load "
            f"without it: exclude=[{name!r}]")


def _near(index: Index, name: str) -> str:
    tail = name.split("/")[-1]
    similar = [n for n in list(index.arrays) + list(index.values) if n.endswith("/" + tail)]
    return f" (it has {similar[:3]})" if similar else ""


def _file_problem(index: Index, piece: Piece, what: str) -> Optional[str]:
    path = index.file(piece.file)
    expected = index.files.get(piece.file)
    try:
        actual = os.path.getsize(path)
    except OSError:
        return f"{path!r}, which holds part of {what!r}, is missing"
    if expected is None or actual < expected or piece.offset + piece.nbytes > actual:
        return (f"{path!r}, which holds part of {what!r}, is truncated: {actual} bytes of "
                f"{expected}")
    return None


def read_piece(index: Index, piece: Piece, dtype: np.dtype, what: str) -> np.ndarray:
    """A piece's elements (1-D), checked against its CRC-32."""
    path = index.file(piece.file)
    count = piece.nbytes // dtype.itemsize
    try:
        data = np.fromfile(path, dtype=dtype, count=count, offset=piece.offset)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path!r}: cannot read {what!r}: {e}") from None
    if data.size != count or crc32(data) != piece.crc32:
        raise CheckpointError(f"{path!r} is damaged: the bytes of {what!r} at offset "
                              f"{piece.offset} do not match their checksum")
    return data


def _overlapping(entry: Array, part: Part) -> List[Piece]:
    return [p for p in entry.pieces if _meets(p, part, entry.shape)]


def _meets(p: Piece, part: Part, shape: Tuple[int, ...]) -> bool:
    if p.flat[0] == p.flat[1] or part.flat[0] == part.flat[1]:
        return False
    if p.box == part.box:
        return p.flat[0] < part.flat[1] and part.flat[0] < p.flat[1]
    pb = p.box or [(0, s) for s in shape]
    qb = part.box or [(0, s) for s in shape]
    return all(a0 < b1 and b0 < a1 for (a0, a1), (b0, b1) in zip(pb, qb))


def _positions(box: Box, flat: Tuple[int, int], shape: Tuple[int, ...]) -> np.ndarray:
    """The global flat positions (C order) of elements ``flat`` of ``box``."""
    b = box or [(0, s) for s in shape]
    grids = np.meshgrid(*[np.arange(a, z) for a, z in b], indexing="ij")
    whole = np.ravel_multi_index([g.reshape(-1) for g in grids], shape) if shape else \
        np.zeros(1, np.int64)
    return whole[flat[0]: flat[1]]


def assemble(index: Index, name: str, entry: Array, part: Part) -> np.ndarray:
    """This rank's part of array ``name`` (1-D), from the pieces that overlap it."""
    out = np.empty(part.flat[1] - part.flat[0], entry.dtype)
    filled = 0
    mine: Optional[np.ndarray] = None
    for piece in _overlapping(entry, part):
        data = read_piece(index, piece, entry.dtype, name)
        if piece.box == part.box:
            lo, hi = max(piece.flat[0], part.flat[0]), min(piece.flat[1], part.flat[1])
            out[lo - part.flat[0]: hi - part.flat[0]] = \
                data[lo - piece.flat[0]: hi - piece.flat[0]]
            filled += hi - lo
            continue
        if mine is None:
            mine = _positions(part.box, part.flat, entry.shape)
        theirs = _positions(piece.box, piece.flat, entry.shape)
        at = np.searchsorted(theirs, mine)
        hit = at < theirs.size
        hit[hit] = theirs[at[hit]] == mine[hit]
        out[hit] = data[at[hit]]
        filled += int(hit.sum())
    if filled != out.size:
        raise CheckpointError(f"array {name!r}: the checkpoint's pieces give {filled} of the "
                              f"{out.size} elements this rank needs")
    return out


def read_all(index: Index, h: Holdings, rank: int, size: int,
             exclude: Sequence[str]) -> Tuple[List[Tuple[Part, np.ndarray]], Dict[str, Any]]:
    """Every part and value this rank loads, read and checked (nothing assigned)."""
    parts = [(part, assemble(index, part.name, index.arrays[part.name], part))
             for part in h.parts if not excluded(part.name, exclude)]
    values: Dict[str, Any] = {}
    for name in h.values:
        if excluded(name, exclude):
            continue
        copy: Copy = choose(index, name, rank, size)
        if copy.none:
            values[name] = np.asarray(None)
        else:
            values[name] = read_piece(index, copy.piece, copy.dtype, name).reshape(copy.shape)
    return parts, values


def assign(parts: List[Tuple[Part, np.ndarray]], values: Dict[str, Any], h: Holdings) -> None:
    """Writes what ``read_all`` read into the arrays and values of ``h``."""
    for part, data in parts:
        dest = part.array
        data = data.reshape(dest.shape)
        if is_cupy_array(dest):
            dest.set(np.ascontiguousarray(data))
        else:
            dest[...] = data
    convert = NpzDeserializer(values)
    for name, held in h.values.items():
        if name in values and held.assign is not None:
            held.assign(convert(name, held.value))
