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
    # (It once passed by mistake: rank 0's second backward took rank 1's later
    # send, d, for the labels' gradient; a gradient is now flagged as one.)
    if mcomm.rank == 0:
        phi = mf.send(np.arange(3.0), mcomm, rank=1)
        phi.backward()
        labels = mf.send(np.array([1, 2], np.int32), mcomm, rank=1)
        labels.backward()
        with chainer.no_backprop_mode():
            mf.recv(mcomm, rank=1)  # d: no gradient goes back
        mcomm.mpi_comm.Barrier()
        assert not mcomm._t.comm.Iprobe(1, 0), "a gradient message was never received"
    elif mcomm.rank == 1:
        x = mf.recv(mcomm, rank=0)
        F.sum(x * x).backward()
        t = mf.recv(mcomm, rank=0)
        assert t.dtype == np.int32
        loss = F.sum(t.array * np.ones(2) * chainer.Variable(np.ones(2)))
        loss, = mf.pseudo_connect(t, loss)  # the labels' (empty) gradient goes back
        loss.backward()
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


# -- messages out of place: refused on both ranks (_mismatch) ----------------------


def on_pair(run):
    """Runs ``run(comm)`` on ranks 0 and 1 of a fresh communicator (the others wait)."""
    comm = mnpar.create_communicator("naive", timeout=20)
    try:
        if comm.rank < 2:
            run(comm)
    finally:
        comm.finalize()


@pytest.mark.mpi(min_size=2)
def test_a_recv_after_a_send_without_its_delegate_is_refused_on_both_ranks():
    # Regression: rank 0's second recv took the gradient of its first send for
    # activations (garbage); rank 1 then failed with chainer's "Function ... has a bug".
    l1, l2 = linear(3, 5, 1), linear(5, 4, 2)
    wanted = {0: r"rank 0: functions.recv from rank 1 \(tag 0\) expected the arrays rank 1 "
                 r"sends forward, but received a gradient \(\(2, 5\) float64\) .* delegate "
                 r"variable did not reach rank 0's backward pass .* pass it to the next recv",
              1: r"rank 1: rank 0 found, on tag 0: rank 0: functions.recv from rank 1 .* a "
                 r"gradient \(\(2, 5\) float64\)"}

    def run(comm):
        with pytest.raises(mnpar.MessageMismatchError, match=wanted[comm.rank]):
            for _ in range(3):
                if comm.rank == 0:
                    mf.send(F.relu(l1(data((2, 3), 0))), comm, rank=1)
                    F.sum(mf.recv(comm, rank=1)).backward()  # delegate_variable forgotten
                else:
                    mf.send(l2(mf.recv(comm, rank=0)), comm, rank=0).backward()
    on_pair(run)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("differs, a, got", [
    ("shape", ((2, 3), np.float64), r"\(2, 3\) float64"),
    ("dtype", ((2, 4), np.float32), r"\(2, 4\) float32"),
])
def test_a_gradient_of_another_shape_or_dtype_is_refused_on_both_ranks(differs, a, got):
    # Two sends without pseudo_connect: the first one's gradient is never received,
    # and the second send's next backward takes it.
    wanted = {0: r"rank 0: functions.send to rank 1 \(tag 0\) sent \(2, 4\) float64 forward "
                 rf"and waited in its backward pass for their gradient, but the gradient rank 1 "
                 rf"sent back is {got}: the gradient of another message\. .* pseudo_connect",
              1: rf"rank 1: rank 0 found, on tag 0: rank 0: functions.send to rank 1 .* {got}"}

    def run(comm):
        with pytest.raises(mnpar.MessageMismatchError, match=wanted[comm.rank]):
            for _ in range(3):
                if comm.rank == 0:
                    mf.send(data(a[0], 1, a[1]), comm, rank=1)
                    mf.send(data((2, 4), 2), comm, rank=1).backward()  # the first one's dropped
                else:
                    ra = mf.recv(comm, rank=0)
                    rb = mf.recv(comm, rank=0, delegate_variable=ra)
                    (F.sum(F.cast(ra, np.float64)) + F.sum(rb)).backward()
    on_pair(run)


@pytest.mark.mpi(min_size=2)
def test_activations_where_a_gradient_is_due_are_refused_on_both_ranks():
    wanted = {0: r"rank 0: functions.send to rank 1 \(tag 3\) sent \(2, 3\) float64 forward .* "
                 r"but received \(2, 3\) float64, which rank 1 sent forward, not as a gradient",
              1: r"rank 1: rank 0 found, on tag 3: .* not as a gradient"}

    def run(comm):
        with pytest.raises(mnpar.MessageMismatchError, match=wanted[comm.rank]):
            if comm.rank == 0:
                mf.send(chainer.Variable(data((2, 3), 0)), comm, rank=1, tag=3).backward()
            else:
                mf.recv(comm, rank=0, tag=3)
                comm.send(np.zeros((2, 3)), 0, tag=3)  # an answer, not a gradient
                mf.recv(comm, rank=0, tag=3)
    on_pair(run)
