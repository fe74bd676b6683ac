"""Replicas and data checked across the grid, one small allgather per forward.

Spatial parallelism is exact only if every rank of a grid holds the same
parameters and its tile of the same images. Two mistakes break that
silently: replicas built from different seeds (or a rank that loaded
another snapshot), and ranks whose iterators read different examples (a
shuffle seeded per rank, ``scatter_dataset`` without ``seed``). At the end
of a converted model's forward every rank sends three fingerprints::

    data      the arguments that are not tiles (labels), the last batch the
              tiled datasets read (index, labels, image shape and a sample of
              the whole image per example), 0 where a rank cannot tell
    params    every parameter and persistent array, at the first forward only
              (sharded weights excepted: they differ by design)
    first     whether this is the model's first forward

A difference is a ``SpatialError`` on every rank, naming the ranks and,
for parameters, the first parameter that differs (one more allgather, on
the error path only).
"""
import hashlib
import threading
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import chainer
import numpy as np

from .._errors import SpatialError
from ..traffic._grid import SpatialGrid

WIDTH = 64  # parameters compared one by one on the error path
_lock = threading.Lock()
_reads: Dict[int, List[int]] = {}  # id(grid) -> digests of examples read since the last forward


def digest(*items: Any) -> int:
    """A 63-bit fingerprint of arrays, numbers and strings (dtype and shape included)."""
    h = hashlib.blake2b(digest_size=8)
    for item in items:
        if isinstance(item, chainer.Variable):
            item = item.array
        if hasattr(item, "shape") and hasattr(item, "dtype"):
            host = item.get() if hasattr(item, "get") and not isinstance(item, np.ndarray) \
                else np.asarray(item)
            h.update(f"{host.dtype.str}{host.shape}".encode())
            h.update(np.ascontiguousarray(host).tobytes())
        else:
            h.update(repr(item).encode())
    return int.from_bytes(h.digest(), "little") >> 1


def sample(x: Any) -> Any:
    """A cheap stand-in for a whole image: its shape and up to 256 evenly spaced values."""
    flat = np.asarray(x).reshape(-1)
    step = max(1, flat.size // 256)
    return (tuple(np.shape(x)), flat[::step][:256])


def record(grid: SpatialGrid, value: int) -> None:
    """A tiled dataset read an example (in the main thread: iterators read batches there)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        _reads.setdefault(id(grid), []).append(value)


def _last_batch(grid: SpatialGrid, n: int) -> int:
    """The fingerprint of the last ``n`` examples read since the last forward, or 0."""
    with _lock:
        reads = _reads.pop(id(grid), [])
    if n <= 0 or len(reads) < n:
        return 0
    return digest(*reads[-n:]) or 1


def _params(model: chainer.Link) -> List[Tuple[str, Any]]:
    out = [(name, p.array) for name, p in sorted(model.namedparams())
           if p.array is not None and not getattr(p, "mnpar_shard_grid", None)]
    for path, link in sorted(model.namedlinks()):
        local = getattr(link, "_mnpar_local_persistents", ())
        for name in sorted(link._persistent):
            value = getattr(link, name, None)
            if name not in local and hasattr(value, "shape"):
                out.append((f"{path.rstrip('/')}/{name}", value))
    return out


def _allgather(grid: SpatialGrid, mine: np.ndarray, what: str) -> np.ndarray:
    rows = np.empty((grid.size,) + mine.shape, mine.dtype)
    if grid.size == 1:
        rows[0] = mine
        return rows
    grid.wait([grid.mpi.Iallgather(mine, rows)], what)
    return rows


def check(grid: SpatialGrid, model: chainer.Link, others: Sequence[Any], batch: int) -> None:
    """Compares this forward's data (and, the first time, ``model``'s parameters) across
    the grid; ``others``: the forward's arguments that are not tiles, ``batch``: the
    number of examples in its tiles (0 if none).

    Raises:
        SpatialError: on every rank alike.
    """
    first = not getattr(model, "_mnpar_checked", False)
    params = _params(model) if first else []
    mine = np.array([digest(*others), _last_batch(grid, batch),
                     digest(*[a for _, a in params]) if first else 0, int(first)], np.int64)
    rows = _allgather(grid, mine, "checking the replicas and the data")
    model._mnpar_checked = True
    ranks = f"grid ranks 0..{grid.size - 1}"
    if (rows[:, 0] != rows[0, 0]).any():
        raise SpatialError(f"the ranks of the grid called {type(model).__name__} with different "
                           f"arguments that are not tiles (labels?): {_groups(rows[:, 0])} "
                           f"({ranks}); every rank must see the same examples in the same order "
                           "(the same ResumableShuffleOrderSampler seed, or "
                           "mnpar.iterators.create_synchronized_iterator)")
    reads = rows[:, 1]
    if (reads != 0).all() and (reads != reads[0]).any():
        raise SpatialError(f"the ranks of the grid read different examples for this batch: "
                           f"{_groups(reads)} ({ranks}): their tiles are not tiles of the same "
                           "images; give every rank the same dataset and order (the same "
                           "ResumableShuffleOrderSampler seed, or "
                           "mnpar.iterators.create_synchronized_iterator; scatter_dataset "
                           "needs a seed)")
    if rows[0, 3] and (rows[:, 2] != rows[0, 2]).any():
        raise SpatialError(_which_param(grid, params, rows[:, 2], type(model).__name__))


def _groups(values: Iterable[int]) -> str:
    """Ranks grouped by the value they hold: ``[0, 2] agree, [1] differ``."""
    seen: Dict[int, List[int]] = {}
    for rank, v in enumerate(values):
        seen.setdefault(int(v), []).append(rank)
    return " / ".join(f"ranks {r} agree" for r in seen.values())


def _which_param(grid: SpatialGrid, params: List[Tuple[str, Any]], values: np.ndarray,
                 model: str) -> str:
    each = np.zeros(WIDTH, np.int64)  # as many on every rank, whatever the models hold
    for i, (name, a) in enumerate(params[:WIDTH]):
        each[i] = digest(name, a)
    rows = _allgather(grid, each, "finding the parameter that differs")
    differ = [i for i in range(WIDTH) if (rows[:, i] != rows[0, i]).any()]
    name = params[differ[0]][0] if differ and differ[0] < len(params) else "?"
    return (f"the parameters of {model} differ across the grid ({_groups(values)}); the first "
            f"that differs is {name!r} ({_groups(rows[:, differ[0]] if differ else values)}): "
            "build the model from the same seed on every rank (np.random.seed before it), or "
            "copy rank 0's with comm.bcast_data(model); a resumed rank must load its own "
            "snapshot of the same iteration")
