"""The pipeline's never-blocking array messages, GPU flag included (on CPUs)."""
import types

import numpy as np
import pytest
from helpers import FakeGpuArray, without_cupy

import mnpar
from mnpar import _arrays
from mnpar.communicators import _message as message
from mnpar.communicators._message import TUPLE, Message
from mnpar.pipeline import _transfer

pytestmark = pytest.mark.mpi(min_size=2)

ARRAYS = [np.arange(6, dtype=np.float16).reshape(2, 3), np.array(7, np.int64),
          np.empty((0, 4), np.float32), np.arange(8.0)[::2]]


def test_arrays_arrive_as_sent_and_sends_never_wait():
    comm = mnpar.create_communicator("naive", timeout=30)
    transfer = _transfer.Transfer(comm)
    if comm.rank < 2:
        peer = 1 - comm.rank
        transfer.send(Message(ARRAYS, TUPLE), peer, tag=3)  # both ranks send first
        got, flags = transfer.recv(peer, tag=3)
        transfer.finish()
        assert flags & TUPLE
        for want, a in zip(ARRAYS, got):
            assert (a.dtype, a.shape) == (want.dtype, want.shape)
            np.testing.assert_array_equal(a, want)
    transfer.free()
    comm.finalize()


def test_large_messages_never_wait_and_are_sent_as_they_were():
    # Past the inline limit Communicator.send waits for its receiver: two ranks
    # that both send first would wait for each other. The pipeline's must not.
    comm = mnpar.create_communicator("naive", timeout=30)
    transfer = _transfer.Transfer(comm)
    if comm.rank < 2:
        peer = 1 - comm.rank
        big = [np.full((512, 512), comm.rank, np.float32), np.arange(70000, dtype=np.int16)]
        transfer.send(Message(big, TUPLE), peer, tag=4)
        big[0][...] = -1  # the caller may reuse its arrays once send returns
        got, flags = transfer.recv(peer, tag=4)
        transfer.finish()
        assert flags & TUPLE and len(got) == 2
        np.testing.assert_array_equal(got[0], np.full((512, 512), peer, np.float32))
        np.testing.assert_array_equal(got[1], np.arange(70000, dtype=np.int16))
    transfer.free()
    comm.finalize()


@pytest.mark.parametrize("receiver_has_cupy", [True, False])
def test_gpu_arrays_land_on_the_receivers_gpu_or_fail_clearly(monkeypatch, receiver_has_cupy):
    comm = mnpar.create_communicator("naive", timeout=30)
    transfer = _transfer.Transfer(comm)
    uploaded = []
    fake_cupy = types.SimpleNamespace(asarray=lambda a: uploaded.append(a) or ["on GPU", a])
    monkeypatch.setattr(message, "is_cupy_array", lambda a: isinstance(a, FakeGpuArray))
    monkeypatch.setattr(message, "to_host", lambda a, pinned=None: FakeGpuArray.get(a))  # no cupyx
    monkeypatch.setattr(message, "_to_device", lambda cp, a: cp.asarray(a))
    monkeypatch.setattr(_arrays, "_cupy", fake_cupy)
    grads = [np.ones((2, 2), np.float32).view(FakeGpuArray), np.empty(0, np.float32)]
    if comm.rank == 0:
        transfer.send(Message(grads), 1, tag=5)
    elif comm.rank == 1:
        if receiver_has_cupy:
            got, _ = transfer.recv(0, tag=5)
            assert [g[0] for g in got] == ["on GPU", "on GPU"]
            assert type(uploaded[0]) is np.ndarray
            np.testing.assert_array_equal(uploaded[0], np.ones((2, 2), np.float32))
        else:
            with without_cupy(), pytest.raises(
                    RuntimeError, match="rank 1: rank 0 sent GPU arrays through the pipeline, "
                                        "but this rank has no cupy"):
                transfer.recv(0, tag=5)
    transfer.free()
    comm.finalize()


K = 16
NBYTES = 256 * 1024  # past the inline limit: each send holds a copy until it completes
HEADER = 1024  # more than one message's header


def test_send_buffers_are_freed_as_the_receiver_takes_them():
    # Regression: the channel forgot completed sends only in batches of 16 MPI
    # sends (a header and a payload each) and never on a receive: rank 0 held 8.
    comm = mnpar.create_communicator("naive", timeout=30)
    transfer = _transfer.Transfer(comm)
    transfer.open()
    if comm.rank == 0:
        for k in range(K):
            transfer.send(Message([np.full(NBYTES // 4, k, np.float32)]), 1, tag=k)
            assert transfer.pending_bytes() >= NBYTES
            transfer.recv(1, tag=k)  # rank 1 has received message k
        peak = transfer.peak_pending_bytes
        transfer.finish()
        assert NBYTES <= peak <= 2 * (NBYTES + HEADER), peak
        assert transfer.pending_bytes() == 0
    elif comm.rank == 1:
        for k in range(K):
            got, _ = transfer.recv(0, tag=k)
            np.testing.assert_array_equal(got[0], np.full(NBYTES // 4, k, np.float32))
            transfer.send(Message([np.array(k)]), 0, tag=k)
        transfer.finish()
        assert transfer.pending_bytes() == 0
    transfer.free()
    comm.finalize()


def test_a_channels_own_send_of_one_small_array_is_counted():
    # Regression: Transport.send's small-message path posted its Isend itself,
    # past the Channel's _post, which counts the bytes a channel holds.
    comm = mnpar.create_communicator("naive", timeout=30)
    channel = comm.channel(" through a test")
    if comm.rank == 0:
        channel.send(np.arange(5.0), 1, 3)
        assert channel.peak_pending_bytes >= 5 * 8
    elif comm.rank == 1:
        np.testing.assert_array_equal(channel.recv(0, 3), np.arange(5.0))
    channel.flush()
    assert channel.pending_bytes() == 0
    channel.free()
    comm.finalize()


def test_send_buffers_are_kept_until_received_then_freed():
    comm = mnpar.create_communicator("naive", timeout=30)
    transfer = _transfer.Transfer(comm)
    transfer.open()
    if comm.rank == 0:
        for k in range(K):
            transfer.send(Message([np.full(NBYTES // 4, k, np.float32)]), 1, tag=k)
        assert transfer.pending_bytes() >= K * NBYTES  # nothing received yet
        comm.send_obj("receive now", 1)
        transfer.recv(1, tag=K)  # rank 1 has received all K
        # At most the last message's completion may not have reached rank 0 yet.
        assert transfer.pending_bytes() <= NBYTES + HEADER
        transfer.finish()
        assert transfer.pending_bytes() == 0
        assert transfer.peak_pending_bytes >= K * NBYTES
        transfer.open()  # the next step's peak starts afresh
        assert transfer.peak_pending_bytes == 0
    elif comm.rank == 1:
        assert comm.recv_obj(0) == "receive now"
        for k in range(K):
            got, _ = transfer.recv(0, tag=k)
            np.testing.assert_array_equal(got[0], np.full(NBYTES // 4, k, np.float32))
        transfer.send(Message([np.array(K)]), 0, tag=K)
        transfer.finish()
    transfer.free()
    comm.finalize()
