"""Memory that large messages land in, used again once their arrays are gone.

A large message is received straight into an array of its own (no copy),
and a large eager send keeps a copy of its arrays until MPI is done with
them. With a fresh ``np.empty`` each time, glibc hands a freed block of
megabytes back to the kernel and the next message faults it in again, page
by page (numpy asks for 2 MiB huge pages from 4 MiB up: each fault zeroes one), a
cost raw mpi4py, receiving again and again into one buffer, never pays
(docs/benchmarks_history.rst, "the receive pool and the size-aware wait").

``empty(shape, dtype)`` returns an array that is a view of a block this
pool keeps. A block is handed out again only when nothing else refers to
it: no array, view, memoryview or request of anyone's. CPython counts those
references (``sys.getrefcount``), and every NumPy view of a view refers to
the block that owns the memory. So a user's array is never overwritten by a
later message, however long it is kept; a training step's activations, freed
after its backward, are where the next step's land.

Blocks come in size classes (eight per octave, so a block serves any size
up to 1/8 over the message), at most ``MAX_PER_CLASS`` per class and
``MAX_HELD`` bytes in all (``MNPAR_RECEIVE_POOL``); a block that would pass either is not kept, and
to make room the blocks of the classes used longest ago are let go first.
An array of this pool does not own its memory (``a.base`` is its block).
The pool is off where ``getrefcount`` cannot be trusted so (``counts_references``).
"""
import os
import sys
import threading
from math import prod
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

MIN_BYTES = 1 << 20  # below this malloc's heap keeps the memory: docs/benchmarks_history.rst
MAX_PER_CLASS = 16  # blocks of one size class: a pipeline's micro-batches in flight
MAX_HELD = 512 << 20  # bytes kept in all, in use or not
ENV_HELD = "MNPAR_RECEIVE_POOL"  # bytes the process's pool keeps; 0 turns it off
STEPS = 8  # size classes per octave


def _unused() -> int:
    """What ``getrefcount`` says of a block only the pool holds, in the loop that
    ``empty`` and ``_room`` use (its list, the loop variable, the argument): measured,
    as interpreters differ in the references they count."""
    blocks = [np.empty(1, np.uint8)]
    for block in blocks:
        return sys.getrefcount(block)
    return 0


UNUSED = _unused()


def size_class(nbytes: int) -> int:
    """The smallest class size of at least ``nbytes``: ``2**k * (1 + j / STEPS)``."""
    shift = nbytes.bit_length() - STEPS.bit_length()
    return nbytes if shift <= 0 else ((nbytes - 1 >> shift) + 1) << shift


class ReceivePool:
    """The blocks of one process, by size class (least recently used first)."""

    def __init__(self, max_held: int = MAX_HELD) -> None:
        self.max_held = max_held
        self.held = 0
        self._classes: Dict[int, List[np.ndarray]] = {}
        self._last = 0  # the class used last, already at the end of ``_classes``
        self._lock = threading.Lock()

    def empty(self, shape: Tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialized array of ``shape`` and ``dtype`` (a ``np.dtype``), in a block
        nobody uses."""
        nbytes = dtype.itemsize * prod(shape)
        if nbytes < MIN_BYTES or dtype.hasobject or not self.max_held:
            return np.empty(shape, dtype)
        # A thread taking a block refers to it from its check until its array does, so
        # no other thread finds it unused meanwhile; the lock keeps the lists and
        # ``held`` consistent.
        with self._lock:
            return self._take(shape, dtype, size_class(nbytes))

    def _take(self, shape: Tuple[int, ...], dtype: Any, size: int) -> np.ndarray:
        if size == self._last:
            blocks = self._classes[size]
        else:  # the class moves to the end: the most recently used
            blocks = self._classes.pop(size, [])
            self._classes[size] = blocks
            self._last = size
        getrefcount = sys.getrefcount
        for block in blocks:
            if getrefcount(block) == UNUSED:
                return np.ndarray(shape, dtype, block)
        block = np.empty(size, np.uint8)
        if len(blocks) < MAX_PER_CLASS and self._room(size):
            blocks.append(block)
            self.held += size
        return np.ndarray(shape, dtype, block)

    def _room(self, size: int) -> bool:
        """Whether a new block of ``size`` bytes can be kept, after letting go of the
        unused blocks of the classes used longest ago as far as needed."""
        getrefcount = sys.getrefcount
        for blocks in list(self._classes.values())[:-1]:
            if self.held + size <= self.max_held:
                break
            kept = []
            for block in blocks:
                if getrefcount(block) == UNUSED:
                    self.held -= block.size
                else:
                    kept.append(block)
            blocks[:] = kept
        return self.held + size <= self.max_held


def held_limit() -> int:
    """``MNPAR_RECEIVE_POOL`` (bytes, 0: no pool), else ``MAX_HELD``."""
    value = os.environ.get(ENV_HELD)
    if value is None:
        return MAX_HELD
    try:
        limit = int(value)
    except ValueError:
        limit = -1
    if limit < 0:
        raise ValueError(f"{ENV_HELD}={value!r}: give the bytes the receive pool may keep, "
                         "an integer of 0 or more (0 turns it off)")
    return limit


def counts_references() -> bool:
    """Whether ``getrefcount`` here counts every reference, as the pool needs: CPython
    3.11 to 3.13 with the GIL. (3.14 may leave references on the stack uncounted, and
    a block in use would look unused; elsewhere the pool is off.)"""
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    return sys.implementation.name == "cpython" and sys.version_info < (3, 14) and gil


POOL = ReceivePool(held_limit() if counts_references() else 0)
empty = POOL.empty


def array_for(shape: Tuple[int, ...], dtype: Optional[np.dtype], nbytes: int) -> np.ndarray:
    """Memory for a large array received, of ``nbytes``: the pool's from ``MIN_BYTES``
    up, else ``np.empty`` without the pool's bookkeeping (``dtype``: a header's, never
    None for an array that is there)."""
    return np.empty(shape, dtype) if nbytes < MIN_BYTES else empty(shape, dtype)


def copied(a: np.ndarray) -> np.ndarray:
    """A C-ordered copy of host array ``a``, in the pool's memory."""
    out = empty(a.shape, a.dtype)
    np.copyto(out, a)
    return out
