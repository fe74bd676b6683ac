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


@pytest.mark.parametrize("order", ["strided", "fortran"])
def test_non_contiguous_arrays_are_packed_by_value(order):
    a = np.arange(24.0).reshape(4, 6)
    a = a[:, ::2] if order == "strided" else np.asfortranarray(a)
    header = message.encode([a], message.INLINE)
    for buf in (message.pack(header, [a]), message.pack_one(a, message.INLINE)):
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


def _landed(blob) -> np.ndarray:
    """A receive buffer with ``blob`` at its start, as MPI leaves it."""
    buf = np.full(message.MAX_HEADER_ONE + 4096, 0xAB, np.uint8)
    raw = np.frombuffer(blob, np.uint8)
    buf[: raw.size] = raw
    return buf


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.dtype(">f8")], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reader_gives_the_inline_array_and_remembers_its_header(dtype, shape):
    a = _sample(dtype, shape)
    buf = _landed(message.pack_one(a, message.INLINE))
    reader = message.Reader(buf)
    header, inline = reader.read()
    assert header == message.decode(buf) and inline is not None
    assert inline.dtype == a.dtype and inline.shape == a.shape
    np.testing.assert_array_equal(inline, a)
    again, view = reader.read()
    assert again is header and view is inline  # remembered, not decoded afresh


def test_reader_never_takes_a_message_of_several_arrays_for_a_remembered_one():
    # The key is as many bytes as a one-array header of the first array's ndim:
    # a two-array message starting with the same array must not match it.
    a, b = np.ones((2, 3), np.float32), np.zeros(5, np.int64)
    buf = _landed(message.pack_one(a, message.INLINE))
    reader = message.Reader(buf)
    reader.read()
    two = message.encode([a, b], message.INLINE | message.TUPLE)
    buf[:] = _landed(message.pack(two, [a, b]))
    header, inline = reader.read()
    assert inline is None and header.flags == message.INLINE | message.TUPLE
    assert [shape for _, shape in header.specs] == [(2, 3), (5,)]


@pytest.mark.parametrize("flags", [0, message.INLINE | message.GPU,
                                   message.INLINE | message.TUPLE])
def test_reader_gives_no_view_where_the_array_is_not_inline_on_the_host(flags):
    a = np.arange(6.0).reshape(2, 3)
    blob = message.pack(message.encode([a], flags), [a]) if flags else message.encode_one(a, 0)
    reader = message.Reader(_landed(blob))
    header, inline = reader.read()
    assert inline is None and header.flags == flags and header.specs == [(a.dtype, a.shape)]


@pytest.mark.parametrize("ndim", [1, 3])
def test_the_one_array_frame_rule_is_the_rule(ndim):
    # The common message decides its frame without lists (inline_one); it must
    # decide as the rule for every message does, at every size around the limit,
    # and pack as ``pack`` does.
    limit = 4096
    for n in range(limit - 96, limit + 16):
        a = np.arange(n, dtype=np.uint8).reshape((n,) + (1,) * (ndim - 1))
        blob = message.inline_one(a, message.INLINE, limit)
        assert (blob is not None) == message.fits_inline([a], limit), n
        if blob is not None:
            assert bytes(blob) == bytes(message.pack(message.encode([a], message.INLINE), [a]))


def test_absent_entries_round_trip_inline_and_cost_no_payload():
    # A gradient that does not exist travels as an absent entry: two header bytes,
    # no payload, and None again on arrival (not a zero-filled or empty array).
    arrays = [np.arange(3, dtype=np.float32), None, np.ones((2, 2), np.int8)]
    flags = message.INLINE | message.TUPLE | message.GRADIENT
    header = message.encode(arrays, flags)
    assert len(header) == message.header_size(arrays)
    blob = np.frombuffer(message.pack(header, arrays), np.uint8)
    assert blob.size == len(header) + 16 + 16  # the absent entry adds no payload
    decoded = message.decode(blob)
    assert decoded.specs[1] == (None, ()) and not decoded.one_host
    got = message.unpack(blob, decoded)
    assert got[1] is None
    np.testing.assert_array_equal(got[0], arrays[0])
    np.testing.assert_array_equal(got[2], arrays[2])
    assert message.nbytes_of(decoded.specs) == [12, 0, 4]


def test_a_message_value_is_what_recv_returns():
    a, b = np.zeros(2), np.ones(3)
    assert message.Message([a]).value is a and not message.Message([a]).is_tuple
    both = message.Message([a, None, b], message.TUPLE | message.GRADIENT)
    assert both.is_tuple and both.value[1] is None and len(both.value) == 3
    arrays, flags = both  # unpacks like the (arrays, flags) pair it replaces
    assert flags & message.GRADIENT and arrays[2] is b


def test_one_host_is_known_from_the_header():
    a = np.zeros(3)
    assert message.decode(message.encode([a], 0)).one_host
    assert message.decode(message.encode([a], message.GRADIENT)).one_host
    assert not message.decode(message.encode([a], message.GPU)).one_host
    assert not message.decode(message.encode([a, a], 0)).one_host
    assert not message.decode(message.encode([None], 0)).one_host
