"""The wire codec: how arrays become a message and come back, in one place.

Every array message of mnpar (point-to-point, collectives, the pipeline) is
encoded here: ``encode``/``decode`` the header, ``pack``/``unpack`` the
payload, ``to_wire``/``restore`` the one policy for GPU arrays,
``fits_inline`` the rule for a message's frame (one MPI message, or a
header followed by the arrays' own memory; ``inline_one`` applies it to one
array and packs it in the same call) and ``repeatable`` the rule for a
payload that may come alone. The transport's framing (``send_arrays``) is
the one place these rules decide a send.

A message (``Message``) is a list of arrays, any of them absent (None: a
gradient that does not exist), and its flags (sent as a tuple or not...).
Its header is a few bytes of ``struct``-packed integers, never a pickle, so
encoding costs microseconds and no code runs on receipt. Layout (little-endian)::

    offset  field
    0       u8   version (1)
    1       u8   flags: 1 payload inline, 2 tuple, 4 sent from GPU memory,
                 8 a gradient (``recv``'s backward sends it back), 16 an error
                 report (the payload: its UTF-8 text)
    2       u16  number of arrays
    4       per array: u8 dtype code (bit 7: big-endian; 0: absent), u8 ndim,
                 ndim x i64 dims

The header is padded to 16 bytes; an inline payload follows, each array's
bytes padded to 16 so that every array received is aligned.
"""
import math
import struct
from types import ModuleType
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union, cast

import numpy as np

from .._arrays import cupy_module, is_cupy_array, pinned_empty, to_host
from . import _pool

VERSION = 1
INLINE, TUPLE, GPU, GRADIENT, ERROR = 1, 2, 4, 8, 16
ALIGN = 16
_BIG_ENDIAN = 0x80
_MAX_NDIM = 64

_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
           np.int64, np.uint64, np.float16, np.float32, np.float64, np.complex64,
           np.complex128, np.longdouble, np.clongdouble]
_CODE = {np.dtype(t): i + 1 for i, t in enumerate(_DTYPES)}
_DTYPE = {i + 1: np.dtype(t) for i, t in enumerate(_DTYPES)}
_HEAD = struct.Struct("<BBH")
_SPEC = struct.Struct("<BB")
# One compiled Struct per ndim: formatting a struct per message costs microseconds.
_ARRAY = [struct.Struct(f"<BB{n}q") for n in range(_MAX_NDIM + 1)]
_DIMS = [struct.Struct(f"<{n}q") for n in range(_MAX_NDIM + 1)]
_PAD = bytes(ALIGN)
_ABSENT = _SPEC.pack(0, 0)


def padded(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


MAX_HEADER_ONE = padded(_HEAD.size + 2 + 8 * _MAX_NDIM)  # the longest one-array header
# Bytes of a message's first MPI message at most: an inline message, or a header.
FIRST_LIMIT = 64 * 1024
MAX_CHUNK = 1 << 30  # bytes per MPI call; below the 2 GiB int count limit


def repeatable(flags: int, nbytes: int, max_chunk: int) -> bool:
    """Whether the next message of a one-host-array message's route may be its payload
    alone (``_routes``): sent in one piece, and larger than any first message."""
    return flags & ~GRADIENT == 0 and FIRST_LIMIT < nbytes <= max_chunk


class Message(NamedTuple):
    """What one send carries: its arrays (None where one is absent) and its flags.

    ``TUPLE`` among the flags: the sender sent a tuple (``value`` is one);
    ``GRADIENT``: ``recv``'s backward sent it back.
    """

    arrays: List[Any]
    flags: int = 0

    @property
    def is_tuple(self) -> bool:
        return bool(self.flags & TUPLE)

    @property
    def value(self) -> Any:
        """What ``recv`` returns: the tuple of arrays, or the one array."""
        return tuple(self.arrays) if self.flags & TUPLE else self.arrays[0]


Spec = Tuple[Optional[np.dtype], Tuple[int, ...]]  # an array's (dtype, shape); None: absent


class Header(NamedTuple):
    flags: int
    specs: List[Spec]
    size: int  # bytes of the encoded header, padding included
    nbytes: int  # bytes of the payload, every array together (padding excluded)
    one_host: bool  # one host array (and no other flag than GRADIENT): the lean receive


def repeatable_header(header: Header, max_chunk: int) -> bool:
    """``repeatable`` of a header read: one host array (no other flag than GRADIENT)
    whose route's next message may be its payload alone (``_routes``, the drain)."""
    return header.one_host and repeatable(header.flags, header.nbytes, max_chunk)


def header_size(arrays: Sequence[Any]) -> int:
    return padded(_HEAD.size + sum(2 if a is None else 2 + 8 * a.ndim for a in arrays))


def fits_inline(arrays: Sequence[Any], limit: int) -> bool:
    """The frame rule: whether a message of ``arrays`` goes as one MPI message (header
    and payload, at most ``limit`` bytes) rather than a header and the arrays' memory."""
    return inline_size(header_size(arrays), [0 if a is None else a.nbytes
                                             for a in arrays]) <= limit


def header_size_one(a: Any) -> int:
    """``header_size([a])``."""
    return padded(_HEAD.size + 2 + 8 * a.ndim)


def dtype_code(dtype: np.dtype) -> int:
    code = _CODE.get(dtype)  # native byte order: the common case
    if code is not None:
        return code
    try:
        code = _CODE[dtype.newbyteorder("=")]
    except KeyError:
        raise TypeError(f"dtype {dtype} cannot be sent") from None
    return code | (_BIG_ENDIAN if dtype.byteorder == ">" else 0)


def encode(arrays: Sequence[Any], flags: int) -> bytes:
    """Encodes the header of a message of ``arrays`` (NumPy or cupy; None: absent)."""
    parts = [_HEAD.pack(VERSION, flags, len(arrays))]
    for a in arrays:
        parts.append(_ABSENT if a is None else
                     _ARRAY[a.ndim].pack(dtype_code(a.dtype), a.ndim, *a.shape))
    raw = b"".join(parts)
    return raw + _PAD[: padded(len(raw)) - len(raw)]


_ENCODED: Dict[Tuple[np.dtype, Tuple[int, ...], int], bytes] = {}
_CACHE_LIMIT = 4096  # distinct (dtype, shape) pairs remembered before starting afresh


def encode_one(a: Any, flags: int) -> bytes:
    """``encode([a], flags)``, remembered per dtype and shape."""
    key = (a.dtype, a.shape, flags)
    header = _ENCODED.get(key)
    if header is None:
        if len(_ENCODED) >= _CACHE_LIMIT:
            _ENCODED.clear()
        header = _ENCODED[key] = encode([a], flags)
    return header


class Reader:
    """Decodes the headers that land in one reusable receive buffer.

    ``read`` returns the header at the start of the buffer and, for the
    common message (one host array, inline, a gradient or not), a view of
    that array in the buffer, which the caller copies before the buffer is
    reused; else None (an error report never gets one: its receiver raises).
    Both are remembered per header: the key is the header's own bytes,
    ``padded(6 + 8 * ndim)`` of them for one array (byte 5 is its ndim). A
    header of several arrays never matches a key remembered (its count,
    bytes 2-3, differs) and is decoded afresh each time.
    """

    __slots__ = ("buf", "_bytes", "_known")

    def __init__(self, buf: np.ndarray) -> None:
        self.buf = buf
        self._bytes = memoryview(cast(Any, buf))  # header reads without NumPy scalars
        self._known: Dict[bytes, Tuple[Header, Optional[np.ndarray]]] = {}

    def read(self) -> Tuple[Header, Optional[np.ndarray]]:
        buf = self._bytes  # (21 + 8 * ndim) & -16 is padded(6 + 8 * ndim), inline
        known = self._known.get(buf[: (21 + 8 * buf[5]) & -16].tobytes())
        return known if known is not None else self._learn()

    def _learn(self) -> Tuple[Header, Optional[np.ndarray]]:
        header = decode(self.buf)
        if len(header.specs) != 1:
            return header, None
        inline = unpack(self.buf, header)[0] if header.flags & ~GRADIENT == INLINE else None
        if len(self._known) >= _CACHE_LIMIT:
            self._known.clear()
        self._known[self.buf[: header.size].tobytes()] = header, inline
        return header, inline


def decode(buf: Any) -> Header:
    """Decodes a header from the start of ``buf``: bytes, or a uint8 array (any buffer;
    numpy's annotations do not call arrays buffers)."""
    version, flags, count = _HEAD.unpack_from(buf, 0)
    if version != VERSION:
        raise RuntimeError(f"received a message with header version {version}, expected "
                           f"{VERSION}: are all ranks running the same mnpar?")
    offset = _HEAD.size
    specs: List[Spec] = []
    for _ in range(count):
        code, ndim = _SPEC.unpack_from(buf, offset)
        shape = _DIMS[ndim].unpack_from(buf, offset + 2)
        offset += 2 + 8 * ndim
        if not code:
            specs.append((None, ()))
            continue
        dtype = _DTYPE[code & ~_BIG_ENDIAN]
        specs.append((dtype.newbyteorder(">") if code & _BIG_ENDIAN else dtype, shape))
    nbytes = sum(nbytes_of(specs))
    one_host = count == 1 and flags & ~GRADIENT == 0 and specs[0][0] is not None
    return Header(flags, specs, padded(offset), nbytes, one_host)


def nbytes_of(specs: Sequence[Spec]) -> List[int]:
    return [0 if dtype is None else math.prod(shape) * dtype.itemsize for dtype, shape in specs]


def inline_size(header_size: int, sizes: List[int]) -> int:
    return header_size + sum(padded(n) for n in sizes)


def pack(header: bytes, arrays: Sequence[Optional[np.ndarray]]) -> Union[bytes, np.ndarray]:
    """One buffer holding ``header`` and every host array's bytes: one copy per array.

    Each array starts ``ALIGN``-aligned, so ``unpack`` can view it in place.
    The common message, one contiguous array, is one ``join`` (it reads the
    array's memory; ``tobytes`` first would copy twice).
    """
    if len(arrays) == 1 and arrays[0] is not None and arrays[0].flags.c_contiguous:
        return b"".join((header, cast(Any, arrays[0])))
    sizes = [0 if a is None else padded(a.nbytes) for a in arrays]
    blob = np.empty(len(header) + sum(sizes), np.uint8)
    blob[: len(header)] = np.frombuffer(header, np.uint8)
    offset = len(header)
    for a, size in zip(arrays, sizes):
        if a is None:
            continue
        if a.nbytes:  # C order, so strided arrays travel by value
            np.copyto(np.ndarray(a.shape, a.dtype, buffer=blob, offset=offset), a)
        blob[offset + a.nbytes: offset + size] = 0
        offset += size
    return blob


def inline_one(a: np.ndarray, flags: int, limit: int) -> Optional[Union[bytes, np.ndarray]]:
    """The common message, one array, as one MPI message: its header (with ``flags``,
    ``INLINE`` among them) and its bytes in one buffer, or None where the frame rule
    (``fits_inline([a], limit)``) says it does not fit: the rule and the packing in
    one call, without the lists (the header is remembered per dtype and shape)."""
    nbytes = a.nbytes
    if nbytes >= limit or (nbytes > limit - MAX_HEADER_ONE
                           and padded(nbytes) + header_size_one(a) > limit):
        return None
    header = _ENCODED.get((a.dtype, a.shape, flags)) or encode_one(a, flags)
    try:
        return b"".join((header, a))  # type: ignore[arg-type]  # (numpy: no Buffer in its stubs)
    except TypeError:  # NumPy lends only C-contiguous memory as plain bytes
        return pack(header, [a])


def pack_one(a: np.ndarray, flags: int) -> Union[bytes, np.ndarray]:
    """``pack(encode_one(a, flags), [a])``, whatever its size."""
    blob = inline_one(a, flags, 1 << 62)
    assert blob is not None
    return blob


def unpack(buf: np.ndarray, header: Header) -> List[Optional[np.ndarray]]:
    """Arrays viewing ``buf`` (no copy), one per spec of ``header`` (None: absent)."""
    out: List[Optional[np.ndarray]] = []
    offset = header.size
    for dtype, shape in header.specs:
        if dtype is None:
            out.append(None)
            continue
        a: np.ndarray = np.ndarray(shape, dtype, buffer=buf, offset=offset)
        out.append(a)
        offset += padded(a.nbytes)
    return out


def to_wire(arrays: Sequence[Any], keep_on_device: bool = False) -> Tuple[Sequence[Any], int]:
    """The arrays a message carries and its GPU flag: the one policy for sending GPU arrays.

    GPU arrays are copied to the host, unless ``keep_on_device`` (MPI reads
    device memory itself: a large message where MPI is CUDA-aware). A message
    with any GPU array is flagged GPU: the pipeline mixes empty host
    placeholders into GPU gradients, and all of them land on the receiver's GPU.
    """
    on_gpu = [is_cupy_array(a) for a in arrays]
    if not any(on_gpu):
        return arrays, 0
    if keep_on_device and all(gpu or a is None for a, gpu in zip(arrays, on_gpu)):
        return arrays, GPU
    return [to_host(a, pinned=True) if gpu else a for a, gpu in zip(arrays, on_gpu)], GPU


def host_buffers(specs: Sequence[Spec], flags: int) -> List[Optional[np.ndarray]]:
    """Host arrays a message's payload is received into: page-locked where they are
    on their way to a GPU (``restore`` copies them there), else plain NumPy."""
    empty = pinned_empty if flags & GPU and cupy_module() is not None else _pool.empty
    return [None if dtype is None else empty(shape, dtype) for dtype, shape in specs]


def restore(arrays: List[Any], flags: int, rank: int, sender: int, via: str = "") -> List[Any]:
    """The arrays received from rank ``sender``, where it had them: the one policy for
    receiving (``rank`` and ``via`` only name the traffic in the error).

    Arrays that left a GPU land on this rank's current GPU. A rank without
    cupy cannot hold them; returning NumPy arrays would only move the error
    to the backward pass, where gradients of the wrong kind go back to a GPU.
    """
    if not flags & GPU:
        return arrays
    cp = cupy_module()
    if cp is None:
        raise RuntimeError(f"rank {rank}: rank {sender} sent GPU arrays{via}, but this rank "
                           "has no cupy; put every stage on a GPU or every stage on the CPU")
    return [a if a is None or is_cupy_array(a) else _to_device(cp, a) for a in arrays]


def _to_device(cp: ModuleType, a: np.ndarray) -> Any:
    """``a`` on the current GPU; ``set`` without a stream copies before it returns, so
    ``a`` (maybe pinned memory the pool hands out again) is free once this returns."""
    if not a.dtype.isnative:  # cupy holds native byte order only: its own conversion
        return cp.asarray(a)
    out = cp.empty(a.shape, a.dtype)
    if a.size:
        out.set(np.ascontiguousarray(a))
    return out


def pieces(a: Any, max_chunk: int) -> List[Any]:
    """``a``'s memory as the MPI messages it travels in, sender and receiver alike:
    itself (C-ordered), or flat chunks of at most ``max_chunk`` bytes, so that counts
    stay within MPI's ``int``. An empty array is one empty message: both sides count
    one message per array whatever path they take."""
    if a.nbytes <= max_chunk:
        return [a if a.flags.c_contiguous else flat_bytes(a)]
    view = flat_bytes(a)
    return [view[i: i + max_chunk] for i in range(0, view.size, max_chunk)]


def flat_bytes(a: Any) -> Any:
    """A contiguous flat uint8 view of a NumPy or cupy array's bytes (a copy if strided)."""
    xp = cupy_module() if is_cupy_array(a) else np
    if not a.flags.c_contiguous:
        a = xp.ascontiguousarray(a)
    return a.reshape(-1).view(xp.uint8)
