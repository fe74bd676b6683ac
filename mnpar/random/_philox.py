"""Philox4x64-10 (Salmon et al., SC'11): random numbers as a pure function of a counter.

A counter-based generator has no state to carry: block ``c`` under key ``k``
is ``philox(c, k)``, four 64-bit words, whatever was drawn before. So a rank
that holds rows 40 to 79 of an activation computes the numbers of those rows
without drawing rows 0 to 39 first, and gets the very numbers one process
gets for them.

Numbering: uniform ``j`` of a stream (key, step) is word ``j % 4`` of block
``j // 4``, counter ``(j // 4, step, 0, 0)``, turned into a double as NumPy
does (its top 53 bits). It is NumPy's own ``Philox`` bit generator, which
runs a long stretch of consecutive uniforms in C; ``philox`` below computes
any blocks with array operations only (the 64 x 64 products in 32-bit
halves), on NumPy and on cupy alike, for short runs and for GPUs. The two
agree bit for bit (``tests/test_random_philox.py``, with the authors'
known-answer vectors).

A normal is two uniforms (2i and 2i + 1) through Box-Muller's cosine branch.
"""
from typing import Any, Tuple

import numpy as np

M0, M1 = 0xD2E7470EE14C6C93, 0xCA5A826395121157  # the round multipliers
W0, W1 = 0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B  # the key schedule's increments
FULL = (1 << 64) - 1
ROUNDS = 10
TWO_53 = 2.0 ** -53
LONG_RUN = 512  # from this many uniforms, a run goes through NumPy's bit generator
CHUNK = 1 << 13  # blocks per pass of the array operations on a CPU
SPREAD = 16  # short runs come from NumPy's stretch over them while it is at most 16 times them
STRETCH = 1 << 20  # numbers drawn at once for short runs (8 MiB)


def _mulhi(a: Any, m: int, xp: Any) -> Any:
    """The high 64 bits of ``a * m`` (uint64 arrays, a constant ``m``), in 32-bit halves."""
    low, half = xp.uint64(0xFFFFFFFF), xp.uint64(32)
    mh, ml = xp.uint64(m >> 32), xp.uint64(m & 0xFFFFFFFF)
    ah, al = a >> half, a & low
    lh, hl = al * mh, ah * ml
    mid = ((al * ml) >> half) + (lh & low) + (hl & low)
    return ah * mh + (lh >> half) + (hl >> half) + (mid >> half)


def philox(counters: Tuple[Any, Any, Any, Any], key: Tuple[int, int],
           xp: Any = np) -> Tuple[Any, Any, Any, Any]:
    """The four output words of Philox4x64-10 for each counter (uint64 arrays or ints)."""
    words = [xp.asarray(c, dtype=xp.uint64) for c in counters]
    shape = xp.broadcast(*words).shape
    flat = [xp.broadcast_to(w, shape).reshape(-1) for w in words]  # arrays, never scalars
    size = flat[0].size
    out: Tuple[Any, ...]
    if xp is not np or size <= CHUNK:
        out = _rounds(flat, key, xp)
    else:
        out = tuple(np.empty(size, np.uint64) for _ in range(4))
        for lo in range(0, size, CHUNK):  # a chunk's temporaries stay in cache
            for o, w in zip(out, _rounds([w[lo:lo + CHUNK] for w in flat], key, xp)):
                o[lo:lo + CHUNK] = w
    w0, w1, w2, w3 = (w.reshape(shape) for w in out)
    return w0, w1, w2, w3


def _rounds(words: Any, key: Tuple[int, int], xp: Any) -> Tuple[Any, Any, Any, Any]:
    c0, c1, c2, c3 = words
    k0, k1 = key[0] & FULL, key[1] & FULL
    m0, m1 = xp.uint64(M0), xp.uint64(M1)
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + W0) & FULL, (k1 + W1) & FULL
        h0, h1 = _mulhi(c0, M0, xp), _mulhi(c2, M1, xp)
        c0, c1, c2, c3 = (h1 ^ c1 ^ xp.uint64(k0), c2 * m1,
                          h0 ^ c3 ^ xp.uint64(k1), c0 * m0)
    return c0, c1, c2, c3


def _double(word: Any, xp: Any) -> Any:
    return (word >> xp.uint64(11)).astype(xp.float64) * TWO_53


def _short_runs(starts: Any, length: int, step: int, key: Tuple[int, int], xp: Any) -> Any:
    """``uniform`` by array operations: the blocks every run touches, at once."""
    two = xp.uint64(2)
    n = (length + 3) // 4 + 1  # blocks a run of ``length`` touches, at most
    blocks = ((starts >> two)[..., None] + xp.arange(n, dtype=xp.uint64)).ravel()
    words = philox((blocks, xp.uint64(step), xp.uint64(0), xp.uint64(0)), key, xp)
    units = xp.stack([_double(w, xp) for w in words], axis=-1).reshape(starts.shape + (4 * n,))
    skip = (starts & xp.uint64(3)).astype(xp.int64)
    return xp.take_along_axis(units, skip[..., None] + xp.arange(length), axis=-1)


def _long_run(start: int, step: int, key: Tuple[int, int], out: np.ndarray) -> None:
    """Fills ``out`` with consecutive uniforms from ``start`` by NumPy's Philox (its
    counter is incremented before each block, hence the one less)."""
    counter = (step << 64) + (start >> 2) - 1
    generator = np.random.Generator(np.random.Philox(counter=counter % (1 << 256),
                                                     key=np.array(key, np.uint64)))
    generator.random(start & 3)  # the block's words before ``start``
    generator.random(out=out)


def uniform(starts: Any, length: int, step: int, key: Tuple[int, int], xp: Any = np) -> Any:
    """Uniforms in [0, 1) for runs of ``length`` consecutive uniforms from each of ``starts``
    (ascending, as a position's runs are).

    Returns float64 of shape ``starts.shape + (length,)``. On a CPU, long runs
    come from NumPy's bit generator one by one; short runs close together
    (a tile's rows) from its stretch over them, picked out; others (and every
    run on a GPU) from the array operations.
    """
    starts = xp.asarray(starts, dtype=xp.uint64)
    if xp is not np or starts.size == 0:
        return _short_runs(starts, length, step, key, xp)
    out = np.empty(starts.shape + (length,))
    rows = out.reshape(-1, length)
    firsts = starts.ravel()
    if length >= LONG_RUN:
        for i, start in enumerate(firsts.tolist()):
            _long_run(start, step, key, rows[i])
        return out
    if int(firsts[-1]) + length - int(firsts[0]) > SPREAD * firsts.size * length:
        return _short_runs(starts, length, step, key, xp)
    offsets = np.arange(length, dtype=np.uint64)
    lo = 0
    while lo < firsts.size:  # groups of runs whose stretch is at most STRETCH numbers
        first = int(firsts[lo])
        hi = int(np.searchsorted(firsts, np.uint64(first + STRETCH - length), "right"))
        hi = max(hi, lo + 1)
        stretch = np.empty(int(firsts[hi - 1]) + length - first)
        _long_run(first, step, key, stretch)
        rows[lo:hi] = stretch[(firsts[lo:hi, None] - np.uint64(first) + offsets).astype(np.intp)]
        lo = hi
    return out


def normal(starts: Any, length: int, step: int, key: Tuple[int, int], xp: Any = np) -> Any:
    """Standard normals for runs of ``length`` from each of ``starts``: normal i is
    uniforms 2i and 2i + 1 through Box-Muller (the cosine branch)."""
    starts = xp.asarray(starts, dtype=xp.uint64)
    u = uniform(starts * xp.uint64(2), 2 * length, step, key, xp)
    u1, u2 = 1.0 - u[..., 0::2], u[..., 1::2]  # u1 in (0, 1]: the logarithm is finite
    return xp.sqrt(-2.0 * xp.log(u1)) * xp.cos(2.0 * np.pi * u2)
