"""The on-disk layout of per-rank snapshots: one name, parsed one way.

Every rank writes its own file, named with the iteration and the rank::

    <prefix>_iter_<iteration>.rank<rank>.npz          a complete snapshot
    .<prefix>_iter_<iteration>.rank<rank>.npz.*.tmp   one being written

A file is written under a temporary name and renamed when complete, so a
name of the first form only ever holds a whole snapshot; the listing also
checks that the file ends in a zip directory, which a file cut short lacks.
Temporary names start with a dot and end in ``.tmp``, so they never match.
"""
import os
import re
import zipfile
from typing import List, Optional, Tuple

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
