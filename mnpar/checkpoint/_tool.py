"""Reading a checkpoint in one process: list it, consolidate it into one chainer npz.

``consolidate`` assembles every array whole from its pieces and writes a
file that ``chainer.serializers.load_npz`` loads in one process:

==============  =====================================================================
``what``        keys of the npz, loadable into
==============  =====================================================================
``'model'``     the model's paths (``l1/W``): ``load_npz(file, model)``
``'trainer'``   a chainer trainer snapshot's paths (``updater/model:main/l1/W``,
                ``updater/optimizer:main/l1/W/m``, ``updater/iteration``, ...):
                ``load_npz(file, trainer)`` for a one-process trainer of the same model
==============  =====================================================================

A value the saving ranks held differently (an iterator over each rank's
shard) has no one-process meaning: it is refused unless ``rank`` says whose
to take.
"""
import os
import re
from typing import Any, Dict, List, Optional

import numpy as np

from ._errors import CheckpointError
from ._format import Index, read_index
from ._holdings import Part
from ._read import ANY_COPY, assemble, read_piece

ITERATION = re.compile(r"(?P<prefix>.+)_iter_(?P<iteration>\d+)")


def whole(index: Index, name: str) -> np.ndarray:
    """Array ``name`` of the checkpoint, whole."""
    entry = index.arrays[name]
    size = int(np.prod(entry.shape))
    part = Part(name, entry.shape, entry.dtype, None, (0, size), None, False)
    return assemble(index, name, entry, part).reshape(entry.shape)


def value(index: Index, name: str, rank: Optional[int] = None) -> Any:
    copies = index.values[name]
    if name in ANY_COPY:
        copies = [min(copies, key=lambda c: min(c.ranks))]
    if len(copies) > 1:
        mine = [c for c in copies if rank is not None and rank in c.ranks]
        if not mine:
            raise CheckpointError(
                f"value {name!r} was held differently by the ranks that wrote it "
                f"({'; '.join(str(c.ranks) for c in copies)}): say whose to take (rank=)")
        copies = mine
    c = copies[0]
    if c.none:
        return np.asarray(None)
    return read_piece(index, c.piece, c.dtype, name).reshape(c.shape)


def _npz_key(name: str, what: str, optimizer: str) -> Optional[str]:
    head, _, rest = name.partition("/")
    if what == "model":
        return rest if head == f"model:{optimizer}" else None
    if head.startswith(("model:", "optimizer:")):
        return f"updater/{name}"
    if head == "trainer":
        return rest
    return None


def consolidate(path: str, out: str, what: str = "model", optimizer: str = "main",
                rank: Optional[int] = None) -> Dict[str, Any]:
    """Writes the checkpoint ``path`` as one chainer npz ``out`` (see the module docstring).

    Args:
        path: the checkpoint's directory.
        out: the npz file to write.
        what: ``'model'`` (the model of ``optimizer``) or ``'trainer'`` (everything).
        optimizer: the name of the optimizer whose model ``'model'`` writes.
        rank: whose copy of a value the ranks held differently to take.

    Returns:
        dict: the arrays written, by key.

    Raises:
        CheckpointError: not a checkpoint, a damaged file, no such model, or a value
            held differently without ``rank``.
    """
    if what not in ("model", "trainer"):
        raise ValueError(f"what={what!r} must be 'model' or 'trainer'")
    index = read_index(path)
    arrays: Dict[str, Any] = {}
    for name in sorted(index.arrays):
        key = _npz_key(name, what, optimizer)
        if key is not None:
            arrays[key] = whole(index, name)
    for name in sorted(index.values):
        key = _npz_key(name, what, optimizer)
        if key is not None:
            arrays[key] = value(index, name, rank)
    if not arrays:
        raise CheckpointError(f"{path!r} holds no model of an optimizer named {optimizer!r} "
                              f"(it has {sorted({n.split('/')[0] for n in index.arrays})})")
    with open(out, "wb") as f:
        np.savez(f, **arrays)
    return arrays


def listing(path: str) -> str:
    """What the checkpoint ``path`` holds, one line an array or value."""
    index = read_index(path)
    lines = [f"checkpoint {path}: {index.ranks} rank(s), iteration {index.iteration}"]
    lines += [f"  rank {r}: {text}" for r, text in enumerate(index.layout)]
    lines += [f"  file {name}: {size} bytes" for name, size in sorted(index.files.items())]
    for name, entry in sorted(index.arrays.items()):
        shape = "x".join(map(str, entry.shape)) or "scalar"
        lines.append(f"array {name} {entry.dtype.name} {shape}: {len(entry.pieces)} piece(s) "
                     f"in {len({p.file for p in entry.pieces})} file(s)")
    for name, copies in sorted(index.values.items()):
        held = ("every rank alike" if len(copies) == 1 else
                f"{len(copies)} different copies ({'; '.join(str(c.ranks) for c in copies)})")
        lines.append(f"value {name}: {held}")
    return "\n".join(lines)


def latest(root: str, prefix: str = "checkpoint") -> Optional[str]:
    """The checkpoint ``<root>/<prefix>_iter_<n>`` of the highest ``n`` (complete by
    construction: a directory gets that name whole), or None."""
    found: List[Any] = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return None
    for name in names:
        match = ITERATION.fullmatch(name)
        if match and match["prefix"] == prefix and os.path.isdir(os.path.join(root, name)):
            found.append((int(match["iteration"]), name))
    return os.path.join(root, max(found)[1]) if found else None
