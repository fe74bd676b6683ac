"""The receive pool: memory used again only once nothing refers to it (no MPI)."""
import gc
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from mnpar.communicators import _pool
from mnpar.communicators._pool import MIN_BYTES, ReceivePool, size_class

F4 = np.dtype(np.float32)
SHAPE = (MIN_BYTES // 4 // 64, 64)  # MIN_BYTES of float32: pooled


def blocks(pool):
    return [b for each in pool._classes.values() for b in each]


def test_size_classes_are_at_most_an_eighth_over():
    for n in [*range(1, 5000, 7), MIN_BYTES - 1, MIN_BYTES, MIN_BYTES + 1, 3 << 20, 10**9]:
        c = size_class(n)
        assert n <= c <= max(n + n // 8, 16), (n, c)
        assert size_class(c) == c  # a class size is its own class


def test_a_released_block_is_used_again():
    pool = ReceivePool()
    a = pool.empty(SHAPE, F4)
    first = a.ctypes.data  # an address: no reference that would keep the block in use
    del a
    b = pool.empty(SHAPE, F4)
    assert b.ctypes.data == first and len(blocks(pool)) == 1


KEEP = {"array": lambda a: a, "slice": lambda a: a[3:5, ::2], "transpose": lambda a: a.T,
        "memoryview": memoryview}


@pytest.mark.parametrize("keep", list(KEEP))
def test_a_block_anything_refers_to_is_never_handed_out(keep):
    pool = ReceivePool()
    a = pool.empty(SHAPE, F4)
    a[...] = 7
    held = KEEP[keep](a)
    del a
    gc.collect()
    b = pool.empty(SHAPE, F4)
    b[...] = -1  # a later message lands
    assert np.all(np.asarray(held) == 7)
    assert len(blocks(pool)) == 2


def test_arrays_have_the_asked_dtype_shape_and_alignment():
    pool = ReceivePool()
    for dtype, shape in [(np.float64, (MIN_BYTES // 8 + 3,)), (np.int8, (MIN_BYTES + 1, 1)),
                         (np.complex128, (2, 3, MIN_BYTES // 16))]:
        a = pool.empty(shape, np.dtype(dtype))
        assert a.dtype == dtype and a.shape == shape and a.flags.c_contiguous
        assert a.flags.writeable and a.ctypes.data % 16 == 0


def test_small_and_object_arrays_are_plain_numpy():
    pool = ReceivePool()
    small = pool.empty((10,), F4)
    objects = pool.empty((MIN_BYTES // 8,), np.dtype(object))
    assert small.base is None and objects.base is None and not blocks(pool)


def test_a_class_keeps_at_most_its_limit(monkeypatch):
    monkeypatch.setattr(_pool, "MAX_PER_CLASS", 3)
    pool = ReceivePool()
    live = [pool.empty(SHAPE, F4) for _ in range(5)]  # all in use at once
    assert len(blocks(pool)) == 3
    assert len({a.ctypes.data for a in live}) == 5  # the two over the limit are their own


def test_room_is_made_from_unused_blocks_of_the_oldest_classes():
    size = size_class(MIN_BYTES)
    pool = ReceivePool(max_held=4 * size)
    old = pool.empty(SHAPE, F4)  # class A, then released
    kept = pool.empty((MIN_BYTES // 4 * 2,), F4)  # class B (2 blocks' worth), in use
    del old
    new = pool.empty((MIN_BYTES // 4 * 3 // 2,), F4)  # class C (1.5): needs A's room
    assert pool.held <= pool.max_held
    assert any(b is new.base for b in blocks(pool)) and any(b is kept.base for b in blocks(pool))
    assert size_class(MIN_BYTES) not in {b.size for b in blocks(pool)}


def test_nothing_is_kept_past_the_limit_while_everything_is_in_use():
    size = size_class(MIN_BYTES)
    pool = ReceivePool(max_held=2 * size)
    live = [pool.empty(SHAPE, F4) for _ in range(4)]
    assert pool.held == 2 * size and len(blocks(pool)) == 2
    assert len({a.ctypes.data for a in live}) == 4


def test_copied_is_a_c_ordered_copy():
    a = np.arange(MIN_BYTES // 4, dtype=np.float32).reshape(-1, 64)[:, ::2]
    c = _pool.copied(a)
    assert c.flags.c_contiguous and not np.shares_memory(a, c)
    np.testing.assert_array_equal(c, a)


def test_an_empty_pool_hands_out_plain_arrays():
    pool = ReceivePool(max_held=0)
    a = pool.empty(SHAPE, F4)
    assert a.base is None and not blocks(pool)


@pytest.mark.parametrize("value, limit", [(None, _pool.MAX_HELD), ("0", 0), ("1048576", 1 << 20)])
def test_the_environment_sets_the_limit(monkeypatch, value, limit):
    if value is None:
        monkeypatch.delenv(_pool.ENV_HELD, raising=False)
    else:
        monkeypatch.setenv(_pool.ENV_HELD, value)
    assert _pool.held_limit() == limit


@pytest.mark.parametrize("value", ["-1", "lots", "1.5e9"])
def test_a_bad_limit_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(_pool.ENV_HELD, value)
    with pytest.raises(ValueError, match="MNPAR_RECEIVE_POOL=.*0 turns it off"):
        _pool.held_limit()


def test_the_pool_is_on_only_where_reference_counts_tell_use(monkeypatch):
    assert _pool.counts_references()  # the CPython versions mnpar supports
    assert _pool.POOL.max_held > 0 or _pool.held_limit() == 0
    monkeypatch.setattr(_pool.sys, "version_info", (3, 14, 0))
    assert not _pool.counts_references()
    monkeypatch.undo()
    monkeypatch.setattr(_pool.sys, "_is_gil_enabled", lambda: False, raising=False)
    assert not _pool.counts_references()


def test_threads_never_share_a_block(monkeypatch):
    # Every reference count the pool reads lets the other threads run (a sleep
    # right after it). A thread taking a block refers to it from its check until
    # its array does, so no other thread finds that block unused meanwhile. Each
    # writes its own value into every array it takes and reads it back: a shared
    # block would show another thread's value. The pool's lists and byte count
    # stay consistent (its lock).
    def counted_then_yield(x):
        n = sys.getrefcount(x) - 1  # less this function's own reference
        time.sleep(1e-4)
        return n

    monkeypatch.setattr(_pool, "sys", SimpleNamespace(getrefcount=counted_then_yield))
    pool = ReceivePool()
    clashes = []

    def take(k):
        for _ in range(20):
            a = pool.empty(SHAPE, F4)
            a[:64] = k
            time.sleep(1e-4)
            if not np.all(a[:64] == k):
                clashes.append(k)
            del a

    threads = [threading.Thread(target=take, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not clashes
    assert pool.held == sum(b.size for b in blocks(pool))
