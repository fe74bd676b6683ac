"""send / recv: the seed MLP written with explicit delegates, tuples, orders, errors.

Transparency: every rank builds the whole model in one process (seeded
layers) and compares its part's outputs and gradients with it.
"""
import copy

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import mnpar
from mnpar import functions as mf

pytestmark = pytest.mark.mpi(min_size=1)
TOL = {np.float16: dict(rtol=1e-2, atol=1e-2), np.float32: dict(rtol=1e-5, atol=1e-6),
       np.float64: dict(rtol=1e-10, atol=1e-12)}


def linear(n_in, n_out, seed, dtype=np.float64):
    with chainer.using_config("dtype", dtype):
        np.random.seed(seed)
        link = L.Linear(n_in, n_out)
    link.cleargrads()
    return link


def data(shape, seed, dtype=np.float64):
    return np.random.RandomState(seed).uniform(-1, 1, shape).astype(dtype)


def assert_grads(part, ref, dtype=np.float64):
    for name in ("W", "b"):
        np.testing.assert_allclose(getattr(part, name).grad, getattr(ref, name).grad,
                                   err_msg=name, **TOL[dtype])


class MLP0(chainer.Chain):
    """The tutorial's rank-0 half, with explicit send/recv and a delegate."""

    def __init__(self, comm, l1):
        super().__init__()
        with self.init_scope():
            self.l1 = l1
        self.comm = comm

    def forward(self, x):
        h0 = F.relu(self.l1(x))
        phi = mf.send(h0, self.comm, rank=1)
        return mf.recv(self.comm, rank=1, delegate_variable=phi)


class MLP1(chainer.Chain):
    """The tutorial's rank-1 half: returns the delegate of its send."""

    def __init__(self, comm, l2, l3):
        super().__init__()
        with self.init_scope():
            self.l2, self.l3 = l2, l3
        self.comm = comm

    def forward(self, *_):
        h0 = mf.recv(self.comm, rank=0)
        h1 = F.relu(self.l2(h0))
        return mf.send(self.l3(h1), self.comm, rank=0)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.mpi(min_size=2)
def test_seed_mlp_with_explicit_delegates(mcomm, dtype):
    l1, l2, l3 = linear(6, 5, 1, dtype), linear(5, 5, 2, dtype), linear(5, 4, 3, dtype)
    x, w = data((3, 6), 0, dtype), data((3, 4), 9, dtype)
    y_ref = l3(F.relu(l2(F.relu(l1(x)))))
    F.sum(y_ref * w).backward()
    if mcomm.rank == 0:
        model = MLP0(mcomm, copy.deepcopy(l1))
    elif mcomm.rank == 1:
        model = MLP1(mcomm, copy.deepcopy(l2), copy.deepcopy(l3))
    else:
        return
    for _ in range(2):
        model.cleargrads()
        if mcomm.rank == 0:
            y = model(x)
            assert y.dtype == dtype
            np.testing.assert_allclose(y.array, y_ref.array, **TOL[dtype])
            F.sum(y * w).backward()
            assert_grads(model.l1, l1, dtype)
        else:
            phi = model()
            assert phi.shape == (0,)
            phi.backward()
            assert_grads(model.l2, l2, dtype)
            assert_grads(model.l3, l3, dtype)


@pytest.mark.mpi(min_size=2)
def test_tuples_travel_as_tuples(mcomm):
    a, b = data((2, 3), 1), data((4,), 2)
    if mcomm.rank == 0:
        va, vb = chainer.Variable(a), chainer.Variable(b)
        phi = mf.send((va, vb), mcomm, rank=1)
        y = mf.recv(mcomm, rank=1, delegate_variable=phi)
        z = mf.recv(mcomm, rank=1, delegate_variable=y, force_tuple=True)
        assert isinstance(y, chainer.Variable)
        assert isinstance(z, tuple) and len(z) == 1
        (F.sum(y) + F.sum(z[0] * 2)).backward()
        np.testing.assert_allclose(va.grad, 2 * a)
        np.testing.assert_allclose(vb.grad, 2 * np.cos(b))
    elif mcomm.rank == 1:
        pair = mf.recv(mcomm, rank=0)
        assert isinstance(pair, tuple) and len(pair) == 2
        np.testing.assert_allclose(pair[1].array, b)
        d1 = mf.send(pair[0] ** 2, mcomm, rank=0)
        v, = mf.pseudo_connect(d1, F.sin(pair[1]))
        mf.send(v, mcomm, rank=0).backward()


@pytest.mark.mpi(min_size=2)
def test_a_one_element_list_arrives_as_a_tuple(mcomm):
    with chainer.no_backprop_mode():
        if mcomm.rank == 0:
            mf.send([np.arange(3.0)], mcomm, rank=1, tag=5)
        elif mcomm.rank == 1:
            got = mf.recv(mcomm, rank=0, tag=5)
            assert isinstance(got, tuple) and len(got) == 1
            np.testing.assert_array_equal(got[0].array, np.arange(3.0))


@pytest.mark.mpi(min_size=2)
def test_several_sends_in_a_row_need_pseudo_connect(mcomm):
    # Rank 0 sends two activations to rank 1 and has no loss of its own; the
    # second send is pseudo-connected to the first so one backward walks both.
    l1, l2 = linear(6, 4, 1), linear(6, 4, 2)
    x, w = data((3, 6), 0), data((3, 4), 9)
    F.sum((l1(x) * F.tanh(l2(x))) * w).backward()
    if mcomm.rank == 0:
        p1, p2 = copy.deepcopy(l1), copy.deepcopy(l2)
        p1.cleargrads()
        p2.cleargrads()
        phi = mf.send(p1(x), mcomm, rank=1)
        h2, = mf.pseudo_connect(phi, p2(x))
        phi = mf.send(h2, mcomm, rank=1)
        phi.backward()
        assert_grads(p1, l1)
        assert_grads(p2, l2)
    elif mcomm.rank == 1:
        a = mf.recv(mcomm, rank=0)
        b = mf.recv(mcomm, rank=0, delegate_variable=a)
        F.sum((a * F.tanh(b)) * w).backward()


@pytest.mark.mpi(min_size=2)
def test_send_takes_part_in_backward_without_gradients(mcomm):
    # Rank 0 sends a plain array (no gradient needed); its delegate's backward
    # must still receive rank 1's gradient, or that message would be left over.
    if mcomm.rank == 0:
        phi = mf.send(np.arange(3.0), mcomm, rank=1)
        phi.backward()
        labels = mf.send(np.array([1, 2], np.int32), mcomm, rank=1)
        labels.backward()
        mcomm.mpi_comm.Barrier()
        assert not mcomm._t.comm.Iprobe(1, 0), "a gradient message was never received"
    elif mcomm.rank == 1:
        x = mf.recv(mcomm, rank=0)
        F.sum(x * x).backward()
        t = mf.recv(mcomm, rank=0)
        assert t.dtype == np.int32
        F.sum(t.array * np.ones(2) * chainer.Variable(np.ones(2))).backward()
        d = mf.send(np.zeros(1), mcomm, rank=0)  # never backpropagated: must not matter
        assert d.creator is not None
        mcomm.mpi_comm.Barrier()
    else:
        mcomm.mpi_comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_no_backprop_mode_only_moves_data(mcomm):
    if mcomm.rank >= 2:
        return
    peer = 1 - mcomm.rank
    with chainer.no_backprop_mode():
        for i in range(3):
            d = mf.send(np.full(2, float(mcomm.rank + i)), mcomm, rank=peer)
            y = mf.recv(mcomm, rank=peer, delegate_variable=d)
            assert y.creator is None
            np.testing.assert_array_equal(y.array, np.full(2, float(peer + i)))


def test_bad_peers_and_data_raise_naming_the_value(mcomm):
    with pytest.raises(ValueError, match=rf"rank={mcomm.rank} is this rank's own rank"):
        mf.send(np.ones(2), mcomm, rank=mcomm.rank)
    with pytest.raises(ValueError, match=rf"rank={mcomm.rank} is this rank's own rank"):
        mf.recv(mcomm, rank=mcomm.rank)
    with pytest.raises(ValueError, match=rf"rank={mcomm.size} is out of range .* size"):
        mf.send(np.ones(2), mcomm, rank=mcomm.size)
    with pytest.raises(TypeError, match="rank must be an int rank, not float"):
        mf.recv(mcomm, rank=1.0)
    with pytest.raises(TypeError, match="x must be a Variable, an array, or a tuple/list of "
                                        "them, not str"):
        mf.send("hello", mcomm, rank=mcomm.rank)
    with pytest.raises(TypeError, match=r"x\[1\] must be a Variable or an array, not int"):
        mf.send((np.ones(1), 3), mcomm, rank=mcomm.rank)


@pytest.mark.mpi(min_size=2)
def test_a_timeout_says_which_pass_and_message_it_waited_for():
    comm = mnpar.create_communicator("naive", timeout=1)
    x = chainer.Variable(np.ones((2, 3)))
    if comm.rank == 1:  # rank 0 never sends
        with pytest.raises(mnpar.CommunicationTimeout,
                           match=r"rank 1: recv with rank 0, tag 5 did not complete after .* "
                                 r"forward pass: the arrays rank 0 sends with functions.send"):
            mf.recv(comm, 0, tag=5)
    comm.mpi_comm.Barrier()
    if comm.rank == 0:  # rank 1 receives but never runs backward
        phi = mf.send(x, comm, 1, tag=6)
        with pytest.raises(mnpar.CommunicationTimeout,
                           match=r"rank 0: recv with rank 1, tag 6 .* backward pass: the "
                                 r"gradients of the arrays of shapes \[\(2, 3\)\] sent to rank 1"):
            phi.backward()
    elif comm.rank == 1:
        mf.recv(comm, 0, tag=6)
    comm.mpi_comm.Barrier()
    comm.finalize()
