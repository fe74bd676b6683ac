"""The self-describing message header: array count, dtype codes and shapes.

A message is one or more arrays. Its header is a few bytes of ``struct``-packed
integers, never a pickle, so encoding costs microseconds and no code runs on
receipt. Layout (little-endian)::

    offset  field
    0       u8   version (1)
    1       u8   flags: 1 payload inline, 2 tuple, 4 sent from GPU memory
    2       u16  number of arrays
    4       per array: u8 dtype code (bit 7: big-endian), u8 ndim, ndim x i64 dims

The header is padded to 16 bytes; an inline payload follows, each array's
bytes padded to 16 so that every array received is aligned.
"""
import struct
from typing import List, NamedTuple, Tuple

import numpy as np

VERSION = 1
INLINE, TUPLE, GPU = 1, 2, 4
ALIGN = 16
_BIG_ENDIAN = 0x80

_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
           np.int64, np.uint64, np.float16, np.float32, np.float64, np.complex64,
           np.complex128, np.longdouble, np.clongdouble]
_CODE = {np.dtype(t): i + 1 for i, t in enumerate(_DTYPES)}
_DTYPE = {i + 1: np.dtype(t) for i, t in enumerate(_DTYPES)}
_HEAD = struct.Struct("<BBH")


class Header(NamedTuple):
    flags: int
    specs: List[Tuple[np.dtype, Tuple[int, ...]]]  # (dtype, shape) per array
    size: int  # bytes of the encoded header, padding included


def padded(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def dtype_code(dtype: np.dtype) -> int:
    big = dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False)
    try:
        return _CODE[dtype.newbyteorder("=")] | (_BIG_ENDIAN if big else 0)
    except KeyError:
        raise TypeError(f"dtype {dtype} cannot be sent") from None


def encode(arrays, flags: int) -> bytes:
    """Encodes the header of a message of ``arrays`` (NumPy or cupy)."""
    parts = [_HEAD.pack(VERSION, flags, len(arrays))]
    for a in arrays:
        parts.append(struct.pack(f"<BB{a.ndim}q", dtype_code(a.dtype), a.ndim, *a.shape))
    raw = b"".join(parts)
    return raw + b"\0" * (padded(len(raw)) - len(raw))


def decode(buf) -> Header:
    """Decodes a header from the start of ``buf`` (bytes-like)."""
    version, flags, count = _HEAD.unpack_from(buf, 0)
    if version != VERSION:
        raise RuntimeError(f"received a message with header version {version}, expected "
                           f"{VERSION}: are all ranks running the same mnpar?")
    offset = _HEAD.size
    specs = []
    for _ in range(count):
        code, ndim = struct.unpack_from("<BB", buf, offset)
        shape = struct.unpack_from(f"<{ndim}q", buf, offset + 2)
        offset += 2 + 8 * ndim
        dtype = _DTYPE[code & ~_BIG_ENDIAN]
        specs.append((dtype.newbyteorder(">") if code & _BIG_ENDIAN else dtype, shape))
    return Header(flags, specs, padded(offset))


def nbytes_of(specs) -> List[int]:
    return [int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for dtype, shape in specs]


def inline_size(header_size: int, sizes: List[int]) -> int:
    return header_size + sum(padded(n) for n in sizes)


def pack_inline(header: bytes, arrays, sizes: List[int]) -> np.ndarray:
    """One buffer holding the header and every (host) array's bytes."""
    buf = np.empty(inline_size(len(header), sizes), np.uint8)
    buf[: len(header)] = np.frombuffer(header, np.uint8)
    offset = len(header)
    for a, n in zip(arrays, sizes):
        if n:
            buf[offset: offset + n] = byte_view(a)
        offset += padded(n)
    return buf


def unpack_inline(buf: np.ndarray, header: Header) -> List[np.ndarray]:
    """Arrays viewing ``buf`` (no copy), one per spec of ``header``."""
    out = []
    offset = header.size
    for (dtype, shape), n in zip(header.specs, nbytes_of(header.specs)):
        out.append(buf[offset: offset + n].view(dtype).reshape(shape))
        offset += padded(n)
    return out


def byte_view(a: np.ndarray) -> np.ndarray:
    """The bytes of a host array as a flat uint8 view (a copy if not contiguous)."""
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)
