"""Point-to-point messages: exact dtypes, shapes and values, no waiting, no hangs.

Messages go round a ring (rank r sends to r+1 and receives from r-1), so every
rank of every run size takes part.
"""
import time

import numpy as np
import pytest
from mpi4py import MPI

import mnpar
from mnpar import CommunicationTimeout

pytestmark = pytest.mark.mpi(min_size=2)

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
          np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
          np.longdouble, np.dtype(">f8")]


def ring(comm):
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def sample(seed, shape, dtype):
    return np.asarray(np.random.default_rng(seed).standard_normal(shape) * 100).astype(dtype)


def exchange(comm, data, tag=0):
    # Rank 0 sends first, the others receive first: large sends wait for their
    # receiver, so a ring where everyone sends first would deadlock.
    nxt, prv = ring(comm)
    if comm.rank == 0:
        comm.send(data, nxt, tag)
        return comm.recv(prv, tag)
    got = comm.recv(prv, tag)
    comm.send(data, nxt, tag)
    return got


def assert_same(got, want):
    assert type(got) is type(want) or isinstance(want, list) and isinstance(got, tuple)
    for g, w in zip(np.atleast_1d(got) if not isinstance(want, (tuple, list)) else got,
                    np.atleast_1d(want) if not isinstance(want, (tuple, list)) else want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 0, 2), (2, 3, 4, 1, 2)], ids=str)
def test_every_dtype_and_shape_arrives_exactly(comm, dtype, shape):
    _, prv = ring(comm)
    got = exchange(comm, sample(comm.rank, shape, dtype))
    want = sample(prv, shape, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows", [6, 40_000])  # inline, and a header plus payload
@pytest.mark.parametrize("order", ["strided", "fortran"])
def test_non_contiguous_array_is_sent_by_value(comm, rows, order):
    # A Fortran-ordered array is one block of memory MPI would take as it is:
    # its bytes must still travel in C order.
    _, prv = ring(comm)
    whole = np.arange(rows * 10.0).reshape(rows, 10)

    def view(a):
        return a[::2, 1::3] if order == "strided" else np.asfortranarray(a)

    sent = view(whole + comm.rank)
    assert not sent.flags.c_contiguous
    got = exchange(comm, sent)
    np.testing.assert_array_equal(got, view(whole + prv))


@pytest.mark.parametrize("size", [3, 100_000])  # inline, and a header plus payload
@pytest.mark.parametrize("shape", [None, (1, -1)], ids=["1d", "2d"])
def test_received_arrays_are_the_receivers_own(comm, size, shape):
    # Inline arrays come out of a reused receive buffer: each must be a copy
    # of its own, writable and aligned, that later messages leave alone.
    _, prv = ring(comm)
    got = [exchange(comm, np.full(size, comm.rank * 10 + i, np.complex128).reshape(
        shape or (size,)), tag=i) for i in range(3)]
    for i, g in enumerate(got):
        assert g.flags.writeable and g.flags.aligned, g.flags
        assert g.ctypes.data % 16 == 0
        np.testing.assert_array_equal(g, np.full(g.shape, prv * 10 + i, np.complex128))
    got[0] += 1  # writing one leaves the others alone
    np.testing.assert_array_equal(got[1], np.full(got[1].shape, prv * 10 + 1, np.complex128))


def test_tuples_and_lists_come_back_as_tuples(comm):
    _, prv = ring(comm)
    got = exchange(comm, [np.full(3, comm.rank, np.int16), np.ones((2, 2), np.float16)])
    assert isinstance(got, tuple) and len(got) == 2
    np.testing.assert_array_equal(got[0], np.full(3, prv, np.int16))
    assert got[1].dtype == np.float16
    assert exchange(comm, (np.zeros(1),))[0].shape == (1,)
    assert exchange(comm, ()) == ()


@pytest.mark.parametrize("inline_limit, max_chunk", [(64 * 1024, 1 << 30), (0, 1000), (0, 7)])
def test_large_messages_are_chunked_and_exact(comm, inline_limit, max_chunk):
    # max_chunk stands in for MPI's 2 GiB count limit: a message of several
    # chunks must arrive whole and in order.
    comm._t.inline_limit, comm._t.max_chunk = inline_limit, max_chunk
    _, prv = ring(comm)
    data = (sample(comm.rank, (300, 7), np.float64), np.arange(5000, dtype=np.int8),
            np.zeros((), np.float32), np.ones((0, 3)))
    got = exchange(comm, data, tag=3)
    want = (sample(prv, (300, 7), np.float64), np.arange(5000, dtype=np.int8),
            np.zeros((), np.float32), np.ones((0, 3)))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("inline_limit, max_chunk", [(64 * 1024, 1 << 30), (0, 1 << 30),
                                                  (0, 7)])
def test_absent_entries_arrive_as_none_on_every_path(comm, inline_limit, max_chunk):
    from mnpar.communicators._message import GRADIENT, TUPLE, Message

    comm._t.inline_limit, comm._t.max_chunk = inline_limit, max_chunk
    nxt, prv = ring(comm)
    sent = Message([None, sample(comm.rank, (30, 2), np.float64), None], TUPLE | GRADIENT)
    comm.send_message(sent, nxt, 6)
    comm.send(np.full(2, comm.rank), nxt, 6)  # the next message stays apart
    got = comm.recv_message(prv, 6)
    assert got.flags & (TUPLE | GRADIENT) == TUPLE | GRADIENT
    assert got.arrays[0] is None and got.arrays[2] is None
    np.testing.assert_array_equal(got.arrays[1], sample(prv, (30, 2), np.float64))
    np.testing.assert_array_equal(comm.recv(prv, 6), np.full(2, prv))


class Tagged(np.ndarray):
    """An ndarray subclass: sent through the general path, not the lean one."""


@pytest.mark.parametrize("inline_limit, max_chunk", [(0, 1 << 30), (0, 7)])
@pytest.mark.parametrize("shape", [(0,), (0, 3), (), (40,)], ids=str)
@pytest.mark.parametrize("kind", ["plain", "subclass", "strided"])
def test_one_array_through_every_path_keeps_messages_apart(comm, inline_limit, max_chunk,
                                                            shape, kind):
    # Header-plus-payload for one array, empty ones included: whichever way
    # the sender goes, the receiver must post as many receives as it sends
    # messages, or the next message would be read as this one's payload.
    comm._t.inline_limit, comm._t.max_chunk = inline_limit, max_chunk
    _, prv = ring(comm)

    def make(rank):  # every other column of a wider array: a strided view
        if not shape:
            return np.array(7.0 + rank)
        wide = np.arange(2 * int(np.prod(shape)), dtype=np.float64) + rank
        return wide.reshape(shape[:-1] + (2 * shape[-1],))[..., ::2]

    data = make(comm.rank)
    if kind == "plain":
        data = data.copy()
    elif kind == "subclass":
        data = data.copy().view(Tagged)  # copy() is C-ordered and keeps 0-d
    got = exchange(comm, data, tag=4)
    after = exchange(comm, np.full(3, comm.rank, np.int16), tag=4)
    want = make(prv)
    assert type(got) is np.ndarray and got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(after, np.full(3, prv, np.int16))


def test_one_megabyte_goes_the_large_path(comm):
    _, prv = ring(comm)
    got = exchange(comm, np.arange(1 << 18, dtype=np.float32) + comm.rank)
    np.testing.assert_array_equal(got, np.arange(1 << 18, dtype=np.float32) + prv)


def test_small_sends_do_not_wait_for_the_receiver(comm):
    # Every rank sends twice before receiving anything; with synchronous sends
    # this would deadlock.
    nxt, prv = ring(comm)
    for i in range(2):
        comm.send(np.full(1000, i), nxt, tag=i)
    assert comm.recv(prv, 1)[0] == 1  # tags may be received out of order
    assert comm.recv(prv, 0)[0] == 0


def test_traffic_never_matches_the_users_receives(comm, world):
    nxt, prv = ring(comm)
    comm.send(np.array([1.0]), nxt, tag=0)
    world.send("user", dest=nxt, tag=0)
    assert world.recv(source=prv, tag=0) == "user"
    np.testing.assert_array_equal(comm.recv(prv, 0), [1.0])


def test_objects_round_trip(comm):
    nxt, prv = ring(comm)
    comm.send_obj({"rank": comm.rank, "x": [1, 2]}, nxt, tag=4)
    assert comm.recv_obj(prv, tag=4) == {"rank": prv, "x": [1, 2]}


@pytest.mark.parametrize("call, error, match", [
    (lambda c: c.send(np.ones(1), c.size), ValueError, r"dest=\d+ is out of range .* size \d"),
    (lambda c: c.send(np.ones(1), -1), ValueError, "dest=-1 is out of range"),
    (lambda c: c.send(np.ones(1), c.rank), ValueError, "this rank's own rank"),
    (lambda c: c.send(np.ones(1), 1.0), TypeError, "dest must be an int rank, not float"),
    (lambda c: c.send(np.ones(1), (c.rank + 1) % c.size, tag=-1), ValueError, "tag=-1"),
    (lambda c: c.send(np.ones(1), (c.rank + 1) % c.size, tag=1 << 40), ValueError,
     "tag=1099511627776 is out of range"),
    (lambda c: c.send(np.ones(1), (c.rank + 1) % c.size, tag=c._t.routes.control_tag), ValueError,
     "reserved for mnpar's control messages"),
    (lambda c: c.send([1, 2], (c.rank + 1) % c.size), TypeError,
     r"data\[0\] must be an array, not int"),
    (lambda c: c.send("abc", (c.rank + 1) % c.size), TypeError, "not str"),
    (lambda c: c.send(np.array(["a"]), (c.rank + 1) % c.size), TypeError, "dtype <U1"),
    (lambda c: c.send(np.array([object()]), (c.rank + 1) % c.size), TypeError, "dtype object"),
    (lambda c: c.recv(c.size + 3), ValueError, "source=.* out of range"),
    (lambda c: c.recv(c.rank), ValueError, "own rank"),
])
def test_bad_input_fails_before_anything_is_sent(comm, call, error, match):
    with pytest.raises(error, match=match):
        call(comm)


def test_timeout_names_operation_peer_and_tag():
    comm = mnpar.create_communicator("naive", timeout=0.5)
    _, prv = ring(comm)
    with pytest.raises(CommunicationTimeout,
                       match=rf"rank {comm.rank}: recv with rank {prv}, tag 9 did not complete"):
        comm.recv(prv, tag=9)
    comm.finalize()


def test_a_receive_that_timed_out_leaves_the_next_one_intact():
    # The first message of each (source, tag) lands through a persistent
    # receive; one cancelled by a timeout must not be started again.
    comm = mnpar.create_communicator("naive", timeout=0.3)
    nxt, prv = ring(comm)
    with pytest.raises(CommunicationTimeout):
        comm.recv(prv, tag=4)
    comm.mpi_comm.Barrier()  # every rank has given up before anything is sent
    for i in range(3):
        comm.send(np.full(3, i + comm.rank), nxt, tag=4)
        np.testing.assert_array_equal(comm.recv(prv, tag=4), np.full(3, i + prv))
    comm.finalize()


def test_large_messages_of_changing_shapes_arrive_exact(comm):
    # Headers of one shape are cached on both sides; a message of another shape
    # (or an inline one) between them must not take a cached layout.
    shapes = [(300, 300), (300, 300), (300, 300), (400, 300), (10,), (300, 300),
              (300, 301), (300, 300)]
    for i, shape in enumerate(shapes):
        data = np.full(shape, 100 * i + comm.rank, np.float32)
        got = exchange(comm, data, tag=6)
        assert got.shape == shape
        np.testing.assert_array_equal(got, np.full(shape, 100 * i + ring(comm)[1], np.float32))


def test_more_tags_than_persistent_receives_kept(comm, monkeypatch):
    from mnpar.communicators import _routes

    monkeypatch.setattr(_routes, "MAX_FIRST", 2)
    nxt, prv = ring(comm)
    for tag in [5, 6, 7, 5, 8, 6]:
        comm.send(np.arange(tag), nxt, tag)
    for tag in [5, 6, 7, 5, 8, 6]:
        np.testing.assert_array_equal(comm.recv(prv, tag), np.arange(tag))
    assert comm._t.routes.firsts <= 2
    assert sum(route.first is not None for route in comm._t.routes.table.values()) <= 2


def test_routes_of_tags_that_never_repeat_are_let_go(comm, monkeypatch):
    # A program whose tags never repeat (one per message) keeps a bounded table of
    # routes; a route holding a repeat's header is kept, and still repeats.
    from mnpar.communicators import _routes

    monkeypatch.setattr(_routes, "MAX_ROUTES", 8)
    nxt, prv = ring(comm)
    large = np.arange(1 << 16, dtype=np.float32) + comm.rank  # 256 KiB: repeats
    exchange(comm, large, tag=1000)
    for tag in range(40):
        comm.send(np.full(3, tag + comm.rank), nxt, tag)
        np.testing.assert_array_equal(comm.recv(prv, tag), np.full(3, tag + prv))
        assert len(comm._t.routes.table) <= 9
    kept = comm._t.routes.find(nxt, 1000), comm._t.routes.find(prv, 1000)
    assert kept[0] is not None and kept[0].sent is not None
    assert kept[1] is not None and kept[1].known is not None
    np.testing.assert_array_equal(exchange(comm, large, tag=1000),
                                  np.arange(1 << 16, dtype=np.float32) + prv)


def test_gpu_arrays_reach_a_rank_without_cupy_as_a_clear_error(comm, monkeypatch):
    # One GPU policy for every receive (the pipeline's, collectives', this one):
    # a rank without cupy cannot hold arrays another rank sent from its GPU.
    from helpers import FakeGpuArray, without_cupy

    from mnpar.communicators import _message

    monkeypatch.setattr(_message, "is_cupy_array", lambda a: isinstance(a, FakeGpuArray))
    monkeypatch.setattr(_message, "to_host",  # no cupyx here
                        lambda a, pinned=None: FakeGpuArray.get(a))
    nxt, prv = ring(comm)
    comm.send((np.ones(4, np.float32).view(FakeGpuArray),), nxt, tag=2)
    with without_cupy(), pytest.raises(RuntimeError, match=rf"rank {comm.rank}: rank {prv} "
                                       "sent GPU arrays, but this rank has no cupy"):
        comm.recv(prv, tag=2)


def test_unread_control_messages_are_dropped(comm):
    # Regression: fire-and-forget control messages nobody read survived the
    # communicator and, with MPI recycling its context, reached the next one.
    from mnpar.communicators._objects import discard_unread

    nxt, prv = ring(comm)
    comm.post_control("wiring", nxt)
    assert discard_unread(comm._t) == 1  # no barrier first: it waits for the message
    assert discard_unread(comm._t) == 0


def test_unread_arrays_and_objects_never_reach_the_next_communicator():
    # Regression (ChainerMN's test_synchronized_iterator at 3 ranks): a test
    # sent arrays its peer never received and finalized; MPI recycled the
    # context and the next communicator's first recv read one of them as its
    # header ("received a message with header version 0").
    for _ in range(5):
        first = mnpar.create_communicator("naive", timeout=20)
        nxt, prv = ring(first)
        first.send(np.zeros(3, np.float32), nxt)  # small: sent without waiting for its receiver
        first.send((np.ones(2), np.ones(3, np.int32)), nxt, tag=3)
        first.send_obj({"a": 1}, nxt, tag=5)
        first.post_control("wiring", nxt)
        first.finalize()
        second = mnpar.create_communicator("naive", timeout=20)
        second.send(np.full(4, second.rank, np.float32), nxt)
        got = second.recv(prv)
        second.finalize()
        np.testing.assert_array_equal(got, np.full(4, prv, np.float32))


def test_recv_obj_of_any_tag_leaves_control_messages_to_poll_control(comm):
    nxt, prv = ring(comm)
    comm.post_control("wiring", nxt)
    comm.send_obj("user", nxt, tag=4)
    status = MPI.Status()
    assert comm.recv_obj(prv, status=status) == "user"  # any tag, as ChainerMN
    assert (status.Get_source(), status.Get_tag()) == (prv, 4)
    assert comm.poll_control() == (prv, "wiring")


def test_control_messages_in_flight_at_finalize_never_reach_the_next_communicator():
    # Regression: finalize right after a control send dropped only what had
    # arrived; a message still on its way matched the next communicator's probe.
    for _ in range(20):
        first = mnpar.create_communicator("naive", timeout=20)
        nxt, prv = ring(first)
        for _ in range(3):
            first.post_control(("error", "stale"), nxt)
        first.finalize()
        second = mnpar.create_communicator("naive", timeout=20)
        second._t.arrive("test")
        time.sleep(0.01)
        stray = strays(second._t)
        second.finalize()
        assert not stray


def strays(t):
    """Whether a message is here that is not an end notice of ``t``'s own finalize.

    A rank that has passed the barrier may finalize (its end notices may be
    here already); reading them into the line keeps them for this rank's finalize.
    """
    status = MPI.Status()
    while t.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
        if status.Get_tag() != t.routes.control_tag:
            return True
        t.line.take_control()
    return bool(t.line.held)


def test_finalize_completes_sends_in_flight():
    comm = mnpar.create_communicator("naive")
    nxt, prv = ring(comm)
    comm.send(np.ones(10), nxt)
    got = comm.recv(prv)
    comm.finalize()
    np.testing.assert_array_equal(got, np.ones(10))
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.size


def test_large_arrays_kept_in_any_form_are_never_overwritten(comm):
    # Large messages land in the receive pool, which hands a block out again only
    # once nothing refers to it: a slice, a transpose or a memoryview keeps it.
    _, prv = ring(comm)
    shape = (512, 1024)  # 2 MiB of float32: pooled
    kept = []
    for i, keep in enumerate([lambda a: a[100:200, ::3], lambda a: a.T, memoryview, None, None]):
        got = exchange(comm, np.full(shape, 1000 * i + comm.rank, np.float32), tag=7)
        if keep is not None:
            kept.append((i, keep(got)))
        del got
    for i, held in kept:
        np.testing.assert_array_equal(np.asarray(held), 1000 * i + prv)


def test_the_wait_for_a_message_spins_as_long_as_the_last_one_from_there_took(
        comm, monkeypatch):
    # A peer that sent a large message is likely busy with such data again: the
    # next wait for it spins longer (by its size) before it sleeps: the wait for its
    # header (``likely``), or, its header known, for the payload itself (a repeat).
    from mnpar.communicators import _transport
    waits = []
    real = _transport.keep_waiting

    def recording(requests, timeout, describe, status=None, nbytes=0, likely=0):
        if describe.op == "recv" and describe.what == f"a message from rank {ring(comm)[1]}":
            waits.append(nbytes + likely)
        return real(requests, timeout, describe, status, nbytes, likely)
    monkeypatch.setattr(_transport, "keep_waiting", recording)
    nxt, prv = ring(comm)
    data = np.ones(1 << 19, np.float32)  # 2 MiB
    for _ in range(2):
        if comm.rank == 0:
            time.sleep(0.05)  # every other rank waits for its message
            comm.send(data, nxt, 8)
            comm.recv(prv, 8)
        else:
            comm.recv(prv, 8)
            time.sleep(0.05)
            comm.send(data, nxt, 8)
    assert waits[0] == 0 and waits[-1] == data.nbytes, waits
