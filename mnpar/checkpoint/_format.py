"""The checkpoint on disk: one file per rank and an index, in one directory.

::

    checkpoint_iter_120/
        index.json                  what every file holds (written last)
        shard-00000-of-00004.bin    rank 0's pieces, end to end, raw (C order)
        shard-00001-of-00004.bin    ...

The index names every array with its global name, global shape and dtype,
and lists its *pieces*: for each, the file, the byte offset and length, a
CRC-32 of the bytes, and which part of the array they are::

    "model:main/l1/W": {"shape": [7, 5], "dtype": "<f4", "pieces": [
        {"file": "shard-00000-of-00002.bin", "offset": 0, "nbytes": 72, "crc32": ...,
         "box": null, "flat": [0, 18]},                 elements 0..17 of W flattened
        {"file": "shard-00001-of-00002.bin", ..., "flat": [18, 35]}]}

``box`` (a start and stop per axis, or null for the whole array) is the
block a rank holds, as tensor-parallel shards hold blocks; ``flat`` the
range of that block's elements (C order) the piece holds, as sharded data
parallelism holds flat ranges. The pieces of an array are disjoint and
cover it.

*Values* are the rest of a trainer's state (iteration, iterators,
extensions, optimizer counters, persistent values): each distinct value
once, with the ranks that held it. A value every rank held alike loads at
any rank count; one the ranks held differently (an iterator over a per-rank
shard of the data) loads only where the same rank count asks for it.

The directory is written under a temporary name and renamed once every
file and the index are on disk (``_write``): a directory of this name is
always whole.
"""
import json
import os
import zlib
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ._errors import CheckpointError

FORMAT = "mnpar-checkpoint"
VERSION = 1
INDEX = "index.json"

Box = Optional[List[Tuple[int, int]]]


def shard_file(rank: int, size: int) -> str:
    """The name of rank ``rank``'s file among ``size``."""
    return f"shard-{rank:05d}-of-{size:05d}.bin"


def box_shape(box: Box, shape: Sequence[int]) -> Tuple[int, ...]:
    """The shape of ``box`` of an array of ``shape`` (the whole shape for None)."""
    if box is None:
        return tuple(int(s) for s in shape)
    return tuple(int(b - a) for a, b in box)


def crc32(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data) & 0xFFFFFFFF


class Piece(NamedTuple):
    """Where one part of an array lies (``file``, ``offset``, ``nbytes``, ``crc32``) and
    which part it is: elements ``flat`` of ``box`` (None: the whole array)."""

    file: str
    offset: int
    nbytes: int
    crc32: int
    box: Box
    flat: Tuple[int, int]

    def to_json(self) -> Dict[str, Any]:
        return {"file": self.file, "offset": self.offset, "nbytes": self.nbytes,
                "crc32": self.crc32, "box": self.box, "flat": list(self.flat)}

    @staticmethod
    def from_json(d: Dict[str, Any]) -> "Piece":
        box = None if d["box"] is None else [(int(a), int(b)) for a, b in d["box"]]
        return Piece(d["file"], int(d["offset"]), int(d["nbytes"]), int(d["crc32"]), box,
                     (int(d["flat"][0]), int(d["flat"][1])))


class Array(NamedTuple):
    """An array of the checkpoint: its global shape, dtype and pieces."""

    shape: Tuple[int, ...]
    dtype: np.dtype
    pieces: List[Piece]


class Copy(NamedTuple):
    """One distinct value of a name, and the ranks that held it (``none``: it was None)."""

    ranks: List[int]
    dtype: np.dtype
    shape: Tuple[int, ...]
    none: bool
    piece: Piece


class Index:
    """The parsed ``index.json`` of the checkpoint in ``path``."""

    def __init__(self, path: str, raw: Dict[str, Any]) -> None:
        self.path = path
        self.raw = raw
        self.ranks: int = int(raw["ranks"])
        self.iteration: Optional[int] = raw.get("iteration")
        self.layout: List[str] = list(raw.get("layout", []))
        self.files: Dict[str, int] = {k: int(v) for k, v in raw["files"].items()}
        self.arrays: Dict[str, Array] = {
            name: Array(tuple(a["shape"]), np.dtype(a["dtype"]),
                        [Piece.from_json(p) for p in a["pieces"]])
            for name, a in raw["arrays"].items()}
        self.values: Dict[str, List[Copy]] = {
            name: [Copy(list(c["ranks"]), np.dtype(c["dtype"]), tuple(c["shape"]),
                        bool(c["none"]), Piece.from_json(c["piece"])) for c in copies]
            for name, copies in raw["values"].items()}

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def describe(self) -> str:
        """What wrote it, in a few words (for messages)."""
        kinds = sorted(set(self.layout))
        return f"{self.ranks} rank(s): " + "; ".join(kinds) if kinds else f"{self.ranks} rank(s)"


def read_index(path: str) -> Index:
    """The index of the checkpoint directory ``path``; ``CheckpointError`` naming the file
    if it is not one."""
    file = os.path.join(path, INDEX)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path!r} is not a checkpoint: no such directory")
    try:
        with open(file) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path!r} is not a checkpoint: it has no {INDEX} (a checkpoint "
                              "directory gets its name only once whole)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file!r} cannot be read as a checkpoint index: {e}") from None
    if raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise CheckpointError(f"{file!r} is not an mnpar checkpoint index of version {VERSION} "
                              f"(format {raw.get('format')!r}, version {raw.get('version')!r})")
    try:
        return Index(path, raw)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{file!r} is a damaged checkpoint index: {e!r}") from None


def write_index(path: str, raw: Dict[str, Any]) -> None:
    file = os.path.join(path, INDEX)
    with open(file, "w") as f:
        json.dump(raw, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
