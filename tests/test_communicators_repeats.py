"""Repeated arrays: a payload that comes without its header (``_routes``, the framing).

Both sides of a route remember the header of its last large one-array
message (its ``Route``); the sender's framing then sends an array with that
header as its payload alone, and the receiver posts that array's receive
before anything arrives. These tests change everything a header says between such messages
(size, dtype, shape, flags, inline or not, several arrays, objects), on
every rank of a ring, and check each message arrives exactly; and that an
object met where a repeat is expected, or a repeat where an object is, is
refused.
"""
import numpy as np
import pytest
from mpi4py import MPI

import mnpar
from mnpar import CommunicationTimeout
from mnpar.communicators import _message as message

pytestmark = pytest.mark.mpi(min_size=2)

N = 256 << 10  # bytes of the arrays that repeat: over the 64 KiB of any first message


def ring(comm):
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def exchange(comm, send, recv):
    """``send()`` to the next rank, ``recv()`` from the previous: rank 0 sends first
    (a large send waits for its receiver)."""
    if comm.rank == 0:
        send()
        return recv()
    got = recv()
    send()
    return got


class Wire:
    """A transport's communicator that counts the MPI sends of each message."""

    def __init__(self, comm):
        self.comm = comm
        self.sizes = []  # bytes of each Isend, in order

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def Isend(self, buf, dest, tag):
        self.sizes.append(len(memoryview(buf[0]).cast("B")))
        return self.comm.Isend(buf, dest, tag)


def spy(transport):
    """The sizes of the MPI messages ``transport`` sends from now on (its outbox posts
    them); ``unspy`` puts its communicator back."""
    transport.outbox.comm = Wire(transport.outbox.comm)
    return transport.outbox.comm.sizes


def unspy(transport):
    transport.outbox.comm = transport.outbox.comm.comm


def values(seed, shape, dtype):
    return (np.arange(np.prod(shape)).reshape(shape) * 7 + seed).astype(dtype)


def test_an_array_sent_again_goes_without_its_header_and_arrives_exact(comm):
    nxt, prv = ring(comm)
    sizes = spy(comm._t)
    kept = []
    for i in range(4):  # new values each time, as a training step sends them
        data = values(10 * i + comm.rank, (256, 256), np.float32)
        kept.append(exchange(comm, lambda data=data: comm.send(data, nxt, 3),
                             lambda: comm.recv(prv, 3)))
    assert sizes == [32, 256 * 256 * 4] + [256 * 256 * 4] * 3  # a 32-byte header, payloads
    unspy(comm._t)
    for i, got in enumerate(kept):  # each array its own: none written by a later message
        np.testing.assert_array_equal(got, values(10 * i + prv, (256, 256), np.float32))


def test_send_repeats_only_the_same_dtype_shape_and_flags(comm):
    # ``send``'s own check of a repeat against every other way to send an array
    # of that size on the route, the non-contiguous array and the gradient included.
    nxt, prv = ring(comm)
    t = comm._t
    sizes = spy(t)
    square = (256, 256)
    steps = [  # (what, dtype, the MPI messages sent: a header's bytes, a payload's)
        ("send", np.float32, [32, N]),
        ("send", np.float32, [N]),  # a repeat
        ("transposed", np.float32, [N]),  # the same header, from another memory order
        ("gradient", np.float32, [32, N]),  # the same array, flagged: a new header
        ("send", np.float32, [32, N]),  # not a gradient: a new header again
        ("send", np.int32, [32, N]),  # same size and shape, another dtype
        ("send", np.int32, [N]),
    ]
    for i, (what, dtype, wire) in enumerate(steps):
        data = values(100 * i + comm.rank, square, dtype)
        if what == "transposed":
            data = np.ascontiguousarray(data.T).T  # Fortran order, the same values
        send = ((lambda d=data: comm.send_message(message.Message([d], message.GRADIENT), nxt, 6))
                if what == "gradient" else (lambda d=data: comm.send(d, nxt, 6)))
        del sizes[:]
        got = exchange(comm, send, lambda: t.recv_message(prv, 6))
        assert sizes == wire, (i, sizes)
        assert got.flags == (message.GRADIENT if what == "gradient" else 0), i
        np.testing.assert_array_equal(got.arrays[0], values(100 * i + prv, square, dtype))
        assert got.arrays[0].dtype == dtype
    unspy(t)


@pytest.mark.parametrize("nbytes", [N, 4 << 20])  # plain arrays, and the receive pool's
def test_every_change_of_header_on_a_route_arrives_exact(comm, nbytes):
    # After each message, the next one on the same route changes what its header
    # says; the arrays that repeat are received into memory posted in advance.
    nxt, prv = ring(comm)
    t = comm._t
    rows = nbytes // 4 // 64
    steps = [
        ("send", (rows, 64), np.float32, 0),
        ("send", (rows, 64), np.float32, 0),  # a repeat
        ("send", (2 * rows, 64), np.float32, 0),  # larger
        ("send", (rows // 2 + 64, 64), np.float32, 0),  # smaller, still framed
        ("send", (rows // 2 + 64, 64), np.int32, 0),  # same size, another dtype
        ("send", (64, rows // 2 + 64), np.int32, 0),  # same size, another shape
        ("send", (64, rows // 2 + 64), np.int32, message.GRADIENT),  # another flag
        ("send", (10,), np.float64, 0),  # inline
        ("send", (64, rows // 2 + 64), np.int32, message.GRADIENT),  # the known one again
        ("tuple", (rows, 64), np.float32, 0),  # one array, as a tuple
        ("several", (rows, 64), np.float32, 0),  # two arrays and an absent one
        ("send", (64, rows // 2 + 64), np.int32, message.GRADIENT),
        ("send", (64, rows // 2 + 64), np.int32, message.GRADIENT),
    ]

    def arrays(seed, kind, shape, dtype):
        a = values(seed, shape, dtype)
        if kind == "several":
            return [a, None, values(seed + 1, (3, 3), np.int8)]
        return [a]

    for i, (kind, shape, dtype, flags) in enumerate(steps):
        if kind == "tuple":
            flags |= message.TUPLE
        msg = message.Message(arrays(100 * i + comm.rank, kind, shape, dtype), flags)
        got = exchange(comm, lambda msg=msg: t.send_message(msg, nxt, 5),
                       lambda: t.recv_message(prv, 5))
        want = arrays(100 * i + prv, kind, shape, dtype)
        assert got.flags & ~message.INLINE == flags and len(got.arrays) == len(want), i
        for g, w in zip(got.arrays, want):
            assert (g is None) == (w is None), i
            if w is not None:
                assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, g.shape)
                np.testing.assert_array_equal(g, w)


def test_objects_between_repeats_on_the_same_tag(comm):
    nxt, prv = ring(comm)
    for i in range(3):
        data = values(i + comm.rank, (N // 8,), np.float64)
        got = exchange(comm, lambda data=data, i=i: (comm.send(data, nxt, 2),
                                                     comm.send_obj({"i": i}, nxt, 2)),
                       lambda: (comm.recv(prv, 2), comm.recv_obj(prv, tag=2)))
        np.testing.assert_array_equal(got[0], values(i + prv, (N // 8,), np.float64))
        assert got[1] == {"i": i}


def object_of_pickled_size(size):
    """bytes whose pickle (as mpi4py makes it) is exactly ``size`` bytes long."""
    overhead = len(MPI.pickle.dumps(bytes(size))) - size  # the same for sizes near it
    obj = bytes(size - overhead)
    assert len(MPI.pickle.dumps(obj)) == size
    return obj


def test_an_object_of_a_repeats_size_still_arrives_as_the_object(comm):
    # Its pickle gets one byte more: never the size of an array's payload alone.
    nxt, prv = ring(comm)
    obj = object_of_pickled_size(N)
    assert len(MPI.pickle.dumps(obj)) == N
    got = exchange(comm, lambda: (comm.send(np.ones(N // 4, np.float32), nxt, 4),
                                  comm.send_obj(obj, nxt, 4)),
                   lambda: (comm.recv(prv, 4), comm.recv_obj(prv, tag=4)))
    assert got[1] == obj


@pytest.mark.parametrize("size", [N, N // 2])  # the repeat's size (padded), and another
def test_an_object_received_where_an_array_is_expected_is_refused(size):
    # Rank 0 sends an array, then an object; rank 1 receives two arrays.
    comm = mnpar.create_communicator("naive", timeout=20)
    if comm.rank == 0:
        comm.send(np.ones(N // 4, np.float32), 1, 4)
        comm.send_obj(object_of_pickled_size(size), 1, 4)
    elif comm.rank == 1:
        comm.recv(0, 4)
        with pytest.raises(mnpar.MessageMismatchError,
                           match="rank 1: rank 0 sent, on tag 4, .*did it send an object"):
            comm.recv(0, 4)
    comm.finalize()


def test_a_repeat_received_where_an_object_is_expected_is_refused():
    comm = mnpar.create_communicator("naive", timeout=20)
    data = np.ones(N // 4, np.float32)
    if comm.rank == 0:
        comm.send(data, 1, 7)
        comm.send(data, 1, 7)
    elif comm.rank == 1:
        comm.recv(0, 7)
        with pytest.raises(mnpar.MessageMismatchError,
                           match=r"rank 1: recv_obj from rank 0 on tag 7 met a float32 array "
                                 r"of shape \(65536,\) that rank 0 sent with send"):
            comm.recv_obj(0, tag=7)
    comm.finalize()


def test_a_receive_of_a_repeat_that_timed_out_leaves_the_next_one_intact():
    # The receive posted in advance is cancelled; the payload, sent later, is
    # received by the next recv.
    comm = mnpar.create_communicator("naive", timeout=0.3)
    nxt, prv = ring(comm)
    data = values(comm.rank, (N // 4,), np.float32)
    comm.mpi_comm.Barrier()
    got = exchange(comm, lambda: comm.send(data, nxt, 6), lambda: comm.recv(prv, 6))
    np.testing.assert_array_equal(got, values(prv, (N // 4,), np.float32))
    with pytest.raises(CommunicationTimeout):
        comm.recv(prv, 6)
    comm.mpi_comm.Barrier()  # every rank has given up before anything is sent
    comm._t.timeout = 20
    for i in range(2):
        data = values(10 * i + comm.rank, (N // 4,), np.float32)
        got = exchange(comm, lambda data=data: comm.send(data, nxt, 6),
                       lambda: comm.recv(prv, 6))
        np.testing.assert_array_equal(got, values(10 * i + prv, (N // 4,), np.float32))
    comm.finalize()


def test_the_pipeline_channel_repeats_with_several_in_flight(comm):
    # An eager channel's sends never wait: several repeats are on their way before
    # the receiver has read the first header.
    channel = comm.channel(" through a test")
    nxt, prv = ring(channel)
    sizes = spy(channel)
    data = np.empty(N // 4, np.float32)
    for i in range(4):  # one array, written anew once each send returns: sent copies
        data[:] = values(i + channel.rank, (N // 4,), np.float32)
        channel.send(data, nxt, 1)
    data[:] = -1
    for i in range(4):
        np.testing.assert_array_equal(channel.recv(prv, 1),
                                      values(i + prv, (N // 4,), np.float32))
    channel.flush()
    assert sizes == [16, N] + [N] * 3  # a header (one dim: 16 bytes), then payloads
    unspy(channel)
    channel.free()


def test_replies_whose_header_changes_arrive_exact(comm, monkeypatch):
    # A ping-pong whose reply's header changes between messages, every wait past
    # its quick tests (as one of 256 KiB waits on a real machine): each reply
    # arrives exact, in an array of its own header, never in memory posted for another.
    from mnpar.communicators import _outbox, _transport

    never = lambda requests, status=None: False  # noqa: E731
    monkeypatch.setattr(_transport, "settled", never)
    monkeypatch.setattr(_outbox, "settled", never)
    if comm.rank >= 2:
        return
    peer = 1 - comm.rank
    shapes = [((N // 4,), np.float32), ((N // 4,), np.float32), ((N // 8,), np.float64),
              ((N // 4 + 16,), np.float32), ((N // 4 + 16,), np.float32), ((5,), np.int8),
              ((N // 4 + 16,), np.float32), ((N // 4 + 16,), np.float32)]
    kept = []
    for i, (shape, dtype) in enumerate(shapes):
        mine = values(10 * i + comm.rank, shape, dtype)
        if comm.rank == 0:
            comm.send(mine, peer, 9)
            got = comm.recv(peer, 9)
        else:
            got = comm.recv(peer, 9)
            comm.send(mine, peer, 9)
        kept.append(got)
    for i, ((shape, dtype), got) in enumerate(zip(shapes, kept)):  # none written later
        want = values(10 * i + peer, shape, dtype)
        assert got.dtype == want.dtype and got.shape == want.shape, i
        np.testing.assert_array_equal(got, want)


def test_the_route_is_the_one_holder_of_what_repeats(comm):
    # Sender and receiver note the same header on the same route object; nothing else
    # of the transport holds it (the drain and recv_obj ask the route).
    from mnpar.communicators._routes import Route

    nxt, prv = ring(comm)
    data = values(comm.rank, (N // 4,), np.float32)
    exchange(comm, lambda: comm.send(data, nxt, 11), lambda: comm.recv(prv, 11))
    routes = comm._t.routes
    sent, got = routes.find(nxt, 11), routes.find(prv, 11)
    assert isinstance(sent, Route) and sent.sent == (np.dtype(np.float32), (N // 4,), 0)
    assert sent.size_to_avoid() == N
    assert got.known is not None and got.payload(N) is got.known and got.payload(N - 1) is None
    holders = [name for name, value in vars(comm._t).items()
               if isinstance(value, dict) and name != "_table"]
    assert holders == []  # no dictionary of routes' state beside the table


def test_a_repeat_route_still_checks_every_argument(comm):
    # ``send`` and ``recv`` skip the rank and tag checks only for exact ints of a
    # route already checked: a NumPy integer goes the long way and arrives; a bool
    # tag equal to the route's is refused on the rank that passed it.
    if comm.rank >= 2:
        return
    peer = 1 - comm.rank
    routes = [(peer, 1), (np.int64(peer), np.int32(1)), (peer, 1)]
    for i, (rank, tag) in enumerate(routes):
        mine = values(i + comm.rank, (N // 4,), np.float32)
        if comm.rank == 0:
            comm.send(mine, rank, tag)
            got = comm.recv(rank, tag)
        else:
            got = comm.recv(rank, tag)
            comm.send(mine, rank, tag)
        np.testing.assert_array_equal(got, values(i + peer, (N // 4,), np.float32))
    with pytest.raises(TypeError, match="tag must be an int, not bool True"):
        comm.send(values(0, (N // 4,), np.float32), peer, True)
    with pytest.raises(TypeError, match="tag must be an int, not bool True"):
        comm.recv(peer, True)
    bad = 2 if comm.size == 2 else comm.rank  # out of range, or this rank's own
    with pytest.raises(ValueError, match=f"dest={bad} is (out of range|this rank's own)"):
        comm.send(values(0, (N // 4,), np.float32), bad, 1)
