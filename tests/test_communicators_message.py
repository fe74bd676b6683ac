"""The binary message header: every dtype and shape survives a round trip."""
import numpy as np
import pytest

from mnpar.communicators import _message as message

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
          np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
          np.longdouble, np.clongdouble, np.dtype(">f4"), np.dtype(">i8")]
SHAPES = [(), (0,), (3,), (2, 0, 4), (2, 3, 4, 5, 1)]


def _sample(dtype, shape):
    rng = np.random.default_rng(0)
    return np.asarray(rng.standard_normal(shape) * 50).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_inline_round_trip_keeps_dtype_shape_and_values(dtype, shape):
    a = _sample(dtype, shape)
    header = message.encode([a], message.INLINE)
    buf = message.pack(header, [a])
    decoded = message.decode(buf)
    (out,) = message.unpack(buf, decoded)
    assert out.dtype == a.dtype and out.shape == a.shape
    np.testing.assert_array_equal(out, a)
    assert decoded.flags == message.INLINE and decoded.size == len(header)


def test_tuple_of_mixed_dtypes_is_aligned_and_exact():
    arrays = [np.arange(3, dtype=np.int8), np.ones((2, 2), np.float64), np.zeros((), np.bool_)]
    header = message.encode(arrays, message.INLINE | message.TUPLE)
    packed = message.pack(header, arrays)
    buf = np.frombuffer(packed, np.uint8).copy()  # as received: into an aligned buffer
    decoded = message.decode(buf)
    out = message.unpack(buf, decoded)
    assert decoded.flags & message.TUPLE
    for a, b in zip(arrays, out):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
        assert b.ctypes.data % message.ALIGN == 0


def test_non_contiguous_arrays_are_packed_by_value():
    a = np.arange(24.0).reshape(4, 6)[:, ::2]
    header = message.encode([a], message.INLINE)
    buf = message.pack(header, [a])
    (out,) = message.unpack(buf, message.decode(buf))
    np.testing.assert_array_equal(out, a)


def test_header_is_small_and_padded():
    a = np.ones((3, 4), np.float32)
    header = message.encode([a], 0)
    assert len(header) == 32  # 4 fixed + 2 + 2 dims * 8 = 22, padded to 32
    assert message.padded(1) == 16 and message.padded(16) == 16 and message.padded(0) == 0


@pytest.mark.parametrize("dtype", [object, "U3", "S2", "M8[s]"])
def test_unsupported_dtypes_are_type_errors(dtype):
    with pytest.raises(TypeError, match="cannot be sent"):
        message.dtype_code(np.dtype(dtype))


def test_wrong_version_is_reported():
    a = np.ones(2)
    buf = bytearray(message.encode([a], 0))
    buf[0] = 99
    with pytest.raises(RuntimeError, match="version 99"):
        message.decode(bytes(buf))
