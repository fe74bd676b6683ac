"""The wiring check: the simulator in one process, then the exchange under MPI."""
import time

import chainer
import chainer.functions as F
import numpy as np
import pytest
from helpers import Fn

import mnpar
from mnpar import WiringError
from mnpar import functions as mf
from mnpar.links import _wiring
from mnpar.links._wiring import Op, check_self_sends, hangs, program, report


def S(peer, component=0):
    return Op("send", peer, component)


def R(peer, component=0):
    return Op("recv", peer, component)


# -- the simulator, in one process --------------------------------------------------


def test_program_lists_receives_then_sends_and_skips_self():
    wirings = [(None, (1, 0)), ((2, 0), None), ((1,), (1, 2))]
    assert program(0, wirings) == [S(1, 0), R(2, 1), R(1, 2), S(1, 2), S(2, 2)]


def test_messages_between_two_ranks_are_named_first_in_first_out():
    # The one matching rule: the k-th send from s to d is the k-th receive on d from s,
    # counted per pair and per direction, a rank's own rank included.
    ops = [S(1), R(1, 1), S(1, 1), S(0, 2), R(0, 3), R(2, 3)]
    assert _wiring.messages(0, ops) == [(0, 1, 0), (1, 0, 0), (0, 1, 1), (0, 0, 0), (0, 0, 0),
                                        (2, 0, 0)]


def test_operations_keep_each_ranks_place_in_rank_in_and_rank_out():
    got = _wiring.operations(0, [(None, (1, 0)), ((2, 0), None)])
    assert [(op, place) for op, place, _ in got] == [(S(1, 0), 0), (S(0, 0), 1),
                                                      (R(2, 1), 0), (R(0, 1), 1)]
    assert got[1][2] == got[3][2] == (0, 0, 0)  # the self-send meets its receive


def test_as_wiring_freezes_any_sequences_of_ranks():
    wiring = _wiring.as_wiring([(None, [1]), ([1, 0], None)])
    assert wiring == (_wiring.Wire(None, (1,)), _wiring.Wire((1, 0), None))
    assert wiring[1].rank_in == (1, 0) and isinstance(wiring, tuple)


def test_matching_programs_have_no_problems():
    seed_mlp = {0: [S(1, 0), R(1, 1)], 1: [R(0), S(0)]}
    ring = {0: [S(1, 0), R(2, 1)], 1: [R(0), S(2)], 2: [R(1), S(0)]}
    branch = {0: [S(1), S(2), R(1, 1), R(2, 1)], 1: [R(0), S(0)], 2: [R(0), S(0)]}
    for programs in (seed_mlp, ring, branch):
        assert hangs(programs) == []


def test_a_send_never_received_is_reported():
    problems = hangs({0: [S(1)], 1: []})
    assert [p.rank for p in problems] == [0]
    assert "rank 0 component 0 sends to rank 1, which is never received" in problems[0].reason
    assert "rank 1 finishes its forward" in problems[0].reason


def test_a_receive_never_satisfied_is_reported():
    problems = hangs({0: [R(1, 2)], 1: []})
    assert "rank 0 component 2 receives from rank 1, which never arrives" in problems[0].reason


def test_receives_in_a_deadlocking_order_are_reported_on_both_sides():
    problems = hangs({0: [R(1, 0), S(1, 1)], 1: [R(0, 0), S(0, 1)]})
    assert sorted(p.rank for p in problems) == [0, 1]
    assert all("is itself blocked" in p.reason for p in problems)


def test_messages_between_two_ranks_match_first_in_first_out():
    # Rank 1 expects two messages from 0 but 0 sends only one before waiting.
    problems = hangs({0: [S(1), R(1, 1)], 1: [R(0), R(0), S(0)]})
    assert {p.rank for p in problems} == {0, 1}


def test_unknown_ranks_are_wildcards():
    assert hangs({0: [S(2), R(2, 1)], 1: [R(3)]}) == []


def test_report_lists_every_rank():
    programs = {0: [S(1)], 1: []}
    text = report(hangs(programs), programs, 3)
    assert "rank 0: send 1" in text and "rank 1: nothing" in text and "rank 2: not checked" in text


def test_self_sends_must_be_received_later():
    check_self_sends(0, [(None, (0,)), ((0,), None)])
    with pytest.raises(WiringError, match=r"component 0 has rank_in=\[0\].*no earlier"):
        check_self_sends(0, [((0,), None), (None, (0,))])
    with pytest.raises(WiringError, match="component 1 sends to its own rank 0"):
        check_self_sends(0, [((1,), None), (None, (0,))])


def test_self_sends_are_received_first_in_first_out():
    check_self_sends(0, [(None, (0, 0)), ((0,), None), ((0,), None)])
    with pytest.raises(WiringError, match=r"component 1 has rank_in=\[0, 0\].*no earlier"):
        check_self_sends(0, [(None, (0,)), ((0, 0), None)])


def test_a_wait_for_data_honours_the_communicator_timeout():
    # One process: the exchange's wait goes through the communicator layer's probe,
    # so it gives up after the communicator's timeout and says what it waited for.
    from mnpar.links._wiring_exchange import Exchange

    comm = mnpar.create_communicator("naive", timeout=0.3)
    try:
        exchange = Exchange(comm)
        index = exchange.announce([], False)
        start = time.monotonic()
        with pytest.raises(mnpar.CommunicationTimeout,
                           match=r"rank 0: MultiNodeChainList recv from rank 0, tag 0 did not "
                                 r"complete after 0\.\d s \(timeout 0\.3 s\); waiting for the "
                                 r"activations rank 0 sends"):
            exchange.await_message(index, 0, 0)
        assert 0.3 <= time.monotonic() - start < 2.0
    finally:
        comm.finalize()


def test_self_send_mismatch_raises_at_the_first_forward():
    comm = mnpar.create_communicator("naive", timeout=20)
    try:
        m = mnpar.MultiNodeChainList(comm)
        m.add_link(chainer.Sequential(F.relu), rank_in=comm.rank, rank_out=None)
        with pytest.raises(WiringError, match="receives from its own rank"):
            m()
    finally:
        comm.finalize()


# -- the exchange, under MPI ----------------------------------------------------------


class Twice(chainer.Chain):
    def forward(self, *xs):
        return sum(x * 2 for x in xs) if xs else chainer.Variable(np.ones(2))


def model(comm, wirings):
    m = mnpar.MultiNodeChainList(comm)
    for rank_in, rank_out in wirings:
        m.add_link(Twice(), rank_in=rank_in, rank_out=rank_out)
    return m


def expect_wiring_error(m, pattern, *inputs, members=None):
    """Rank ``members`` (default: all) raise ``pattern`` at once; the rest run undisturbed."""
    start = time.monotonic()
    if members is None or m._comm.rank in members:
        with pytest.raises(WiringError, match=pattern):
            m(*inputs)
    else:
        assert m(*inputs) is None
    assert time.monotonic() - start < 5.0


@pytest.mark.mpi(min_size=2)
def test_sends_without_receives_raise_on_both_ranks(mcomm):
    # Ranks from 2 on run a model of their own (no traffic): it is not this one.
    wirings = {0: [(None, 1)], 1: [(None, 0)]}.get(mcomm.rank, [])
    m = model(mcomm, wirings)
    expect_wiring_error(m, r"rank 0 component 0 sends to rank 1, which is never received",
                        np.ones(2), members={0, 1})


@pytest.mark.mpi(min_size=2)
def test_receives_in_deadlock_order_raise_on_both_ranks(mcomm):
    wirings = {0: [(1, None), (None, 1)], 1: [(0, None), (None, 0)]}.get(mcomm.rank, [])
    m = model(mcomm, wirings)
    expect_wiring_error(m, r"(?s)rank 0 component 0 receives from rank 1.*is itself blocked",
                        np.ones(2), members={0, 1})


@pytest.mark.mpi(min_size=3)
def test_a_wrong_receive_order_over_three_ranks_raises(mcomm):
    # 1 sends to 2 only after hearing from 2, and 2 waits for 1 before sending.
    wirings = {0: [(None, 1)], 1: [([0, 2], 2)], 2: [(1, 1)]}.get(mcomm.rank, [])
    m = model(mcomm, wirings)
    expect_wiring_error(m, "rank 2 component 0 receives from rank 1", np.ones(2),
                        members={0, 1, 2})


@pytest.mark.mpi(min_size=2)
def test_plain_send_recv_ranks_are_left_out_of_the_check(mcomm):
    # Rank 0 uses functions.send/recv, rank 1 a MultiNodeChainList; rank 1 waits
    # about a second for a wiring that never comes, then goes on. The wiring it
    # sent to rank 0 is never received, and must not disturb anything.
    x = np.arange(4.0)
    for step in range(3):
        if mcomm.rank == 0:
            v = chainer.Variable(x + step)
            phi = mf.send(v, mcomm, rank=1)
            y = mf.recv(mcomm, rank=1, delegate_variable=phi)
            np.testing.assert_array_equal(y.array, 2 * (x + step))
            F.sum(y).backward()
            np.testing.assert_array_equal(v.grad, np.full(4, 2.0))
        elif mcomm.rank == 1:
            if step == 0:
                m = model(mcomm, [(0, 0)])
            start = time.monotonic()
            m().backward()
            assert time.monotonic() - start < (3.0 if step == 0 else 0.5)
        elif step == 0:
            model(mcomm, [])()  # idle ranks with a model drain what rank 1 sent them


@pytest.mark.mpi(min_size=2)
def test_several_models_on_one_rank_keep_working(mcomm):
    # Rank 0 splits its part into an encoder and a decoder model.
    if mcomm.rank == 0:
        enc, dec = model(mcomm, [(None, 1)]), model(mcomm, [(1, None)])
        v = chainer.Variable(np.arange(3.0))
        phi = enc(v)
        y, = mf.pseudo_connect(phi, dec())
        np.testing.assert_array_equal(y.array, 8 * np.arange(3.0))
        F.sum(y).backward()
        np.testing.assert_array_equal(v.grad, np.full(3, 8.0))
    elif mcomm.rank == 1:
        model(mcomm, [(0, 0)])().backward()
    else:
        model(mcomm, [])()


@pytest.mark.mpi(min_size=2)
def test_communicating_links_inside_a_component_make_the_wiring_unknown(mcomm):
    # Rank 0's component sends through a MultiNodeNStepRNN of its own; its model's
    # wiring shows no send, so the check must not take it at its word.
    import chainer.links as L

    if mcomm.rank == 0:
        encoder = mnpar.links.create_multi_node_n_step_rnn(L.NStepGRU(1, 2, 3, 0.0), mcomm,
                                                           rank_out=1)

        def encode(s, x):
            hy, ys, delegate = s.encoder([x])
            return mf.pseudo_connect(delegate, F.sum(ys[0]))[0]

        m = mnpar.MultiNodeChainList(mcomm)
        m.add_link(Fn(encode, encoder=encoder), rank_in=None, rank_out=None)
        m(np.ones((4, 2), np.float32)).backward()
        assert encoder.actual_rnn.ws[0][0].grad is not None
    elif mcomm.rank == 1:
        m = model(mcomm, [])
        m.add_link(Fn(lambda s, states: F.sum(states[0] ** 2)), rank_in=0, rank_out=None)
        m().backward()
    else:
        model(mcomm, [])()


@pytest.mark.mpi(min_size=2)
def test_a_timeout_in_the_first_forward_says_whether_the_peer_got_there():
    comm = mnpar.create_communicator("naive", timeout=2)
    try:
        if comm.rank == 0:  # rank 1 never runs its model
            m = model(comm, [(1, None)])
            with pytest.raises(mnpar.CommunicationTimeout,
                               match=r"rank 0: MultiNodeChainList recv from rank 1, tag 0 did "
                                     r"not complete .*waiting for the activations rank 1 sends "
                                     r"to this component; rank 1 has not sent this "
                                     r"model's wiring"):
                m()
        comm.mpi_comm.Barrier()
    finally:
        comm.finalize()
