"""The on-disk layout of per-rank snapshots: one name, parsed one way.

Every rank writes its own file, named with the iteration and the rank::

    <prefix>_iter_<iteration>.rank<rank>.npz          a complete snapshot
    .<prefix>_iter_<iteration>.rank<rank>.npz.*.tmp   one being written

A file is written under a temporary name and renamed when complete, so a
name of the first form only ever holds a whole snapshot; the listing also
checks that the file ends in a zip directory, which a file cut short lacks.
Temporary names start with a dot and end in ``.tmp``, so they never match.

Each file also says what wrote it (``WRITTEN_BY``, one more entry of the
npz, which chainer's ``load_npz`` never reads): the rank count, the rank, and
how the models it holds are split (each ``MultiNodeChainList``'s wiring and,
for ``build_stage``'s stages, the cut; ``mnpar_split``)::

    {"ranks": 2, "rank": 1, "splits": {"main:/predictor": {"wiring": [[[0], [0]]],
     "build_stage": {"balance": [2, 1], "chunks": 1, ...}}}}

so that a snapshot loaded under another rank count or split is refused by
name (``_resume``), never loaded into arrays of other sizes.
"""
import json
import os
import re
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import chainer
import numpy as np
from chainer import serializers

WRITTEN_BY = "_mnpar_written_by"  # the npz entry: what wrote the file (JSON text)
Layout = Dict[str, Any]  # what writes or loads a snapshot: ranks, rank, splits

_NAME = re.compile(r"(?P<prefix>[^/\\]+)_iter_(?P<iteration>\d+)\.rank(?P<rank>\d+)\.npz")


def check_prefix(prefix: str) -> str:
    """Validates a snapshot prefix: a non-empty file name part, no directories."""
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"prefix={prefix!r} must be a non-empty string")
    if "/" in prefix or os.sep in prefix or prefix.startswith("."):
        raise ValueError(f"prefix={prefix!r} must be a plain file name part: no directory "
                         "separators, not starting with '.'")
    return prefix


def snapshot_filename(iteration: int, rank: int, prefix: str = "snapshot") -> str:
    """The file name of ``rank``'s snapshot at ``iteration``.

    Args:
        iteration: the updater's iteration when the snapshot was taken.
        rank: the rank that wrote it.
        prefix: the name's first part.

    Returns:
        str: e.g. ``snapshot_iter_120.rank1.npz``.
    """
    return f"{check_prefix(prefix)}_iter_{int(iteration)}.rank{int(rank)}.npz"


def parse_snapshot_filename(name: str) -> Optional[Tuple[str, int, int]]:
    """``(prefix, iteration, rank)`` of a snapshot file name, or None if it is not one.

    Args:
        name: a file name or path; only its last component is read.

    Returns:
        ``(prefix, iteration, rank)``, or None for any other name (temporary
        files included).
    """
    match = _NAME.fullmatch(os.path.basename(name))
    if match is None:
        return None
    return match["prefix"], int(match["iteration"]), int(match["rank"])


def temporary_prefix(iteration: int, rank: int, prefix: str) -> str:
    """The start of the temporary name a snapshot is written under."""
    return "." + snapshot_filename(iteration, rank, prefix) + "."


def is_temporary(name: str, rank: int, prefix: str) -> bool:
    """Whether ``name`` is a temporary snapshot file of ``rank`` (left by a crash)."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return False
    parsed = parse_snapshot_filename(name[1:].rsplit(".", 2)[0])
    return parsed is not None and parsed[0] == prefix and parsed[2] == rank


def is_complete(path: str) -> bool:
    """Whether ``path`` is a whole npz file (its zip directory is readable)."""
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def complete_iterations(directory: str, rank: int, prefix: str = "snapshot") -> List[int]:
    """The iterations of ``rank``'s complete snapshots in ``directory``, ascending.

    Args:
        directory: where the snapshots are; a missing directory has none.
        rank: whose snapshots to list.
        prefix: the snapshots' name prefix.

    Returns:
        list of int: sorted iterations; temporary and truncated files never count.
    """
    check_prefix(prefix)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        parsed = parse_snapshot_filename(name)
        if parsed is None or parsed[0] != prefix or parsed[2] != rank:
            continue
        if is_complete(os.path.join(directory, name)):
            found.append(parsed[1])
    return sorted(found)


def layout_of(target: Any, ranks: int, rank: int, **more: Any) -> Layout:
    """What a rank that writes (or loads) ``target`` is: ``ranks``, ``rank`` and the
    split of every model in it (a trainer's optimizers' targets, or a link)."""
    splits: Dict[str, Any] = {}
    for name, model in _models(target):
        for path, link in model.namedlinks():
            split = getattr(link, "mnpar_split", None)
            if split is not None:
                splits[f"{name}{path}"] = split
    return {"ranks": int(ranks), "rank": int(rank), "splits": splits, **more}


def _models(target: Any) -> List[Tuple[str, Any]]:
    if isinstance(target, chainer.Link):
        return [("", target)]
    optimizers = getattr(getattr(target, "updater", None), "get_all_optimizers", None)
    if optimizers is None:
        return []
    return [(f"{name}:", opt.target) for name, opt in sorted(optimizers().items())
            if isinstance(getattr(opt, "target", None), chainer.Link)]


def save_npz(path: str, target: Any, layout: Optional[Layout]) -> None:
    """chainer's ``save_npz`` of ``target`` (compressed), with ``layout`` as ``WRITTEN_BY``."""
    if layout is None:
        serializers.save_npz(path, target)
        return
    s = serializers.DictionarySerializer()
    s.save(target)
    with open(path, "wb") as f:
        np.savez_compressed(f, **with_layout(s.target, layout))


def with_layout(arrays: Dict[str, Any], layout: Layout) -> Dict[str, Any]:
    """``arrays`` (a serialized target) with ``layout`` added as ``WRITTEN_BY``."""
    return {**arrays, WRITTEN_BY: np.array(json.dumps(layout, sort_keys=True))}


def written_by(path: str) -> Optional[Layout]:
    """What wrote the snapshot ``path``; None where it does not say (an older file, or
    one written by chainer or ChainerMN)."""
    try:
        with np.load(path) as npz:
            if WRITTEN_BY not in npz.files:
                return None
            return json.loads(str(npz[WRITTEN_BY]))
    except (OSError, ValueError, zipfile.BadZipFile):
        return None


def other_ranks(directory: str, prefix: str, size: int) -> Dict[int, int]:
    """Per iteration, the highest rank at or above ``size`` whose complete snapshot is
    in ``directory``: files that more ranks than this job's wrote."""
    found: Dict[int, int] = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return found
    for name in names:
        parsed = parse_snapshot_filename(name)
        if parsed is None or parsed[0] != prefix or parsed[2] < size:
            continue
        if is_complete(os.path.join(directory, name)):
            found[parsed[1]] = max(found.get(parsed[1], 0), parsed[2])
    return found


def describe(layout: Layout) -> str:
    """``rank 0 of 2 ranks, holding main:/predictor: build_stage(balance=[2, 1], ...)``."""
    ranks = layout["ranks"]
    who = f"rank {layout['rank']} of {ranks} rank{'s' * (ranks != 1)}"
    if layout.get("replica_set") is not None:
        who += f" (replica set {layout['replica_set']})"
    splits = layout.get("splits") or {}
    if not splits:
        return f"{who}, holding no split model"
    return f"{who}, holding " + "; ".join(f"{path or 'the model'}: {split_text(split)}"
                                          for path, split in sorted(splits.items()))


def split_text(split: Dict[str, Any]) -> str:
    """A ``mnpar_split`` as the call that made it."""
    stage = split.get("build_stage")
    if stage is not None:
        return (f"build_stage(balance={stage['balance']}, chunks={stage['chunks']}, "
                f"loop={stage['loop']}, placement={stage['placement']!r}) of a model with "
                f"fingerprint {stage['model']}")
    wiring = ", ".join(f"({_ranks(i)}, {_ranks(o)})" for i, o in split["wiring"])
    return f"a MultiNodeChainList wired (rank_in, rank_out) [{wiring}]"


def _ranks(ranks: Optional[List[int]]) -> str:
    if ranks is None:
        return "None"
    return str(ranks[0]) if len(ranks) == 1 else str(ranks)
