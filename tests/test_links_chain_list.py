"""MultiNodeChainList: transparency against the same model in one process.

Every rank builds the whole reference model (same seeded weights, float64)
and its own part of the split model from copies of the same layers, runs
forward and backward, and compares its part's outputs and gradients with the
reference. Ranks outside a test's topology run an empty MultiNodeChainList,
so that the wiring check hears from every rank at once.
"""
import copy

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from helpers import Fn

import mnpar

pytestmark = pytest.mark.mpi(min_size=1)
TOL = {np.float16: dict(rtol=1e-2, atol=1e-2), np.float32: dict(rtol=1e-5, atol=1e-6),
       np.float64: dict(rtol=1e-10, atol=1e-12)}


def layers(dtype=np.float64, sizes=(("l1", 6, 5), ("l2", 5, 5), ("l3", 5, 4))):
    """Seeded Linear layers, the same on every rank."""
    out = {}
    with chainer.using_config("dtype", dtype):
        for i, (name, n_in, n_out) in enumerate(sizes):
            np.random.seed(100 + i)
            out[name] = L.Linear(n_in, n_out)
            out[name].cleargrads()
    return out


def data(shape, seed, dtype=np.float64):
    return np.random.RandomState(seed).uniform(-1, 1, shape).astype(dtype)


def weighted_sum(y, seed):
    return F.sum(y * data(y.shape, seed, y.dtype))


def assert_grads(part, ref, dtype=np.float64):
    for name in ("W", "b"):
        np.testing.assert_allclose(getattr(part, name).grad, getattr(ref, name).grad,
                                   err_msg=name, **TOL[dtype])


def idle(comm):
    """An uninvolved rank's model: no components, one (empty) wiring."""
    assert mnpar.MultiNodeChainList(comm)() is None


def test_public_names():
    assert mnpar.links.MultiNodeChainList is mnpar.MultiNodeChainList
    for module in (mnpar.functions, mnpar.links, mnpar.datasets):
        assert all(hasattr(module, name) for name in module.__all__)
    assert {"MultiNodeChainList", "functions", "links", "datasets"} <= set(mnpar.__all__)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.mpi(min_size=2)
def test_seed_mlp_matches_one_process(mcomm, dtype):
    ref = layers(dtype)
    x = data((3, 6), 0, dtype)
    part = {k: copy.deepcopy(v) for k, v in ref.items()}
    relu = F.relu
    if mcomm.rank == 0:
        model = mnpar.MultiNodeChainList(mcomm)
        model.add_link(Fn(lambda s, x: relu(s.l1(x)), l1=part["l1"]), rank_in=None, rank_out=1)
        model.add_link(Fn(lambda s, y: y), rank_in=1, rank_out=None)
    elif mcomm.rank == 1:
        model = mnpar.MultiNodeChainList(mcomm)
        model.add_link(Fn(lambda s, h: s.l3(relu(s.l2(h))), l2=part["l2"], l3=part["l3"]),
                       rank_in=0, rank_out=0)
    y_ref = ref["l3"](relu(ref["l2"](relu(ref["l1"](x)))))
    weighted_sum(y_ref, 1).backward()
    if mcomm.rank >= 2:
        idle(mcomm)
        return
    for _ in range(2):  # the second forward runs without the wiring check
        run_and_check(mcomm, model, x, y_ref, part, ref, {"l1": 0, "l2": 1, "l3": 1},
                      dtype=dtype)


def run_and_check(mcomm, model, x, y_ref, part, ref, owners, output_rank=0,
                  dtype=np.float64, input_rank=0):
    """One forward and backward of ``model`` (``input_rank`` feeds ``x``), checked against ``ref``.

    The output rank compares its output with ``y_ref`` and backpropagates the
    same weighted sum as the reference; every rank then checks the gradients
    of the layers ``owners`` gives it (``{layer name: rank}``).
    """
    model.cleargrads()
    out = model(x) if mcomm.rank == input_rank else model()
    if mcomm.rank == output_rank:
        np.testing.assert_allclose(out.array, y_ref.array, **TOL[dtype])
        weighted_sum(out, 1).backward()
    elif out is not None:
        out.backward()
    for name, rank in owners.items():
        if rank == mcomm.rank:
            assert_grads(part[name], ref[name], dtype)


def _three_layer_topology(mcomm, build, expect_output_rank):
    """Runs a model whose components are l1, l2, l3 over ranks; checks every gradient."""
    ref = layers()
    x = data((3, 6), 0)
    part = {k: copy.deepcopy(v) for k, v in ref.items()}
    y_ref = ref["l3"](F.tanh(ref["l2"](F.tanh(ref["l1"](x)))))
    weighted_sum(y_ref, 1).backward()
    model = build(mcomm.rank, part)
    if model is None:
        idle(mcomm)
        return
    run_and_check(mcomm, model, x, y_ref, part, ref, {"l1": 0, "l2": 1, "l3": 2},
                  expect_output_rank)


@pytest.mark.mpi(min_size=3)
def test_chain_over_three_ranks(mcomm):

    def build(rank, p):
        m = mnpar.MultiNodeChainList(mcomm)
        if rank == 0:
            m.add_link(Fn(lambda s, x: F.tanh(s.l1(x)), l1=p["l1"]), rank_in=None, rank_out=1)
        elif rank == 1:
            m.add_link(Fn(lambda s, h: F.tanh(s.l2(h)), l2=p["l2"]), rank_in=0, rank_out=2)
        elif rank == 2:
            m.add_link(Fn(lambda s, h: s.l3(h), l3=p["l3"]), rank_in=1, rank_out=None)
        else:
            return None
        return m

    _three_layer_topology(mcomm, build, expect_output_rank=2)


@pytest.mark.mpi(min_size=3)
def test_ring_zero_one_two_zero(mcomm):

    def build(rank, p):
        m = mnpar.MultiNodeChainList(mcomm)
        if rank == 0:
            m.add_link(Fn(lambda s, x: F.tanh(s.l1(x)), l1=p["l1"]), rank_in=None, rank_out=1)
            m.add_link(Fn(lambda s, y: y), rank_in=2, rank_out=None)
        elif rank == 1:
            m.add_link(Fn(lambda s, h: F.tanh(s.l2(h)), l2=p["l2"]), rank_in=0, rank_out=2)
        elif rank == 2:
            m.add_link(Fn(lambda s, h: s.l3(h), l3=p["l3"]), rank_in=1, rank_out=0)
        else:
            return None
        return m

    _three_layer_topology(mcomm, build, expect_output_rank=0)


@pytest.mark.mpi(min_size=3)
def test_branch_and_merge(mcomm):
    # 0 sends to 1 and 2; 1 and 2 send back to 0, which merges them in rank_in order.
    ref = layers(sizes=(("l1", 6, 5), ("l2", 5, 4), ("l3", 5, 4)))
    x = data((3, 6), 0)
    part = {k: copy.deepcopy(v) for k, v in ref.items()}
    h = F.tanh(ref["l1"](x))
    y_ref = ref["l2"](h) * 2.0 + F.sin(ref["l3"](h))
    weighted_sum(y_ref, 1).backward()
    m = mnpar.MultiNodeChainList(mcomm)
    if mcomm.rank == 0:
        m.add_link(Fn(lambda s, x: F.tanh(s.l1(x)), l1=part["l1"]), rank_in=None,
                   rank_out=[1, 2])
        m.add_link(Fn(lambda s, a, b: a * 2.0 + b), rank_in=[1, 2], rank_out=None)
    elif mcomm.rank == 1:
        m.add_link(Fn(lambda s, h: s.l2(h), l2=part["l2"]), rank_in=0, rank_out=0)
    elif mcomm.rank == 2:
        m.add_link(Fn(lambda s, h: F.sin(s.l3(h)), l3=part["l3"]), rank_in=0, rank_out=0)
    run_and_check(mcomm, m, x, y_ref, part, ref, {"l1": 0, "l2": 1, "l3": 2})


@pytest.mark.mpi(min_size=2)
def test_self_send_and_positional_order(mcomm):
    # Rank 0 sends to itself and to 1; its merge receives [1, 0]: (from 1, from itself).
    ref = layers(sizes=(("l1", 6, 5), ("l2", 5, 5), ("l3", 5, 4)))
    x = data((3, 6), 0)
    part = {k: copy.deepcopy(v) for k, v in ref.items()}
    h = F.tanh(ref["l1"](x))
    y_ref = ref["l3"](F.tanh(ref["l2"](h)) - 3.0 * h)
    weighted_sum(y_ref, 1).backward()
    if mcomm.rank >= 2:
        idle(mcomm)
        return
    m = mnpar.MultiNodeChainList(mcomm)
    if mcomm.rank == 0:
        m.add_link(Fn(lambda s, x: F.tanh(s.l1(x)), l1=part["l1"]), rank_in=None,
                   rank_out=[0, 1])
        m.add_link(Fn(lambda s, a, b: s.l3(a - 3.0 * b), l3=part["l3"]), rank_in=[1, 0],
                   rank_out=None)
    else:
        m.add_link(Fn(lambda s, h: F.tanh(s.l2(h)), l2=part["l2"]), rank_in=0, rank_out=0)
    run_and_check(mcomm, m, x, y_ref, part, ref, {"l1": 0, "l2": 1, "l3": 0})


def test_self_send_only_in_one_process(mcomm):
    # A model that only talks to itself works on any rank, without communication.
    ref = layers()
    x = data((3, 6), 0)
    part = {k: copy.deepcopy(v) for k, v in ref.items()}
    y_ref = ref["l2"](F.tanh(ref["l1"](x)))
    weighted_sum(y_ref, 1).backward()
    r = mcomm.rank
    m = mnpar.MultiNodeChainList(mcomm)
    m.add_link(Fn(lambda s, x: F.tanh(s.l1(x)), l1=part["l1"]), rank_in=None, rank_out=r)
    m.add_link(Fn(lambda s, h: s.l2(h), l2=part["l2"]), rank_in=r, rank_out=None)
    m.cleargrads()
    y = m(x)
    weighted_sum(y, 1).backward()
    np.testing.assert_allclose(y.array, y_ref.array, **TOL[np.float64])
    assert_grads(part["l1"], ref["l1"])
    assert_grads(part["l2"], ref["l2"])


@pytest.mark.mpi(min_size=2)
def test_tuple_messages_and_tuple_output(mcomm):
    ref = layers(sizes=(("l1", 6, 5), ("l2", 6, 5), ("l3", 5, 4)))
    x = data((3, 6), 0)
    part = {k: copy.deepcopy(v) for k, v in ref.items()}
    a_ref, b_ref = ref["l1"](x), ref["l2"](x)
    u_ref, v_ref = ref["l3"](a_ref * b_ref), F.tanh(b_ref)
    (weighted_sum(u_ref, 1) + weighted_sum(v_ref * 2.0, 2)).backward()
    if mcomm.rank >= 2:
        idle(mcomm)
        return
    m = mnpar.MultiNodeChainList(mcomm)
    if mcomm.rank == 0:
        m.add_link(Fn(lambda s, x: (s.l1(x), s.l2(x)), l1=part["l1"], l2=part["l2"]),
                   rank_in=None, rank_out=1)
        m.add_link(Fn(lambda s, uv: (uv[0], uv[1] * 2.0)), rank_in=1, rank_out=None)
    else:
        def second(s, ab):
            assert isinstance(ab, tuple) and len(ab) == 2
            return s.l3(ab[0] * ab[1]), F.tanh(ab[1])
        m.add_link(Fn(second, l3=part["l3"]), rank_in=0, rank_out=0)
    m.cleargrads()
    if mcomm.rank == 0:
        u, v2 = m(x)
        np.testing.assert_allclose(u.array, u_ref.array, **TOL[np.float64])
        (weighted_sum(u, 1) + weighted_sum(v2, 2)).backward()
        assert_grads(part["l1"], ref["l1"])
        assert_grads(part["l2"], ref["l2"])
    else:
        m().backward()
        assert_grads(part["l3"], ref["l3"])


@pytest.mark.mpi(min_size=2)
def test_output_from_a_middle_component(mcomm):
    # Rank 0's output comes from its second component; a third one still sends
    # after it, and rank 1 turns that into a second loss term.
    ref = layers(sizes=(("l1", 6, 5), ("l2", 5, 4), ("l3", 6, 5), ("l4", 5, 3)))
    x = data((3, 6), 0)
    part = {k: copy.deepcopy(v) for k, v in ref.items()}
    y0_ref = F.tanh(ref["l2"](F.tanh(ref["l1"](x))))
    y1_ref = ref["l4"](F.tanh(ref["l3"](x)))
    (weighted_sum(y0_ref, 1) + weighted_sum(y1_ref, 2)).backward()
    if mcomm.rank >= 2:
        idle(mcomm)
        return
    m = mnpar.MultiNodeChainList(mcomm)
    if mcomm.rank == 0:
        m.add_link(Fn(lambda s, x: F.tanh(s.l1(x)), l1=part["l1"]), rank_in=None, rank_out=1)
        m.add_link(Fn(lambda s, h: F.tanh(h)), rank_in=1, rank_out=None)
        m.add_link(Fn(lambda s, x: F.tanh(s.l3(x)), l3=part["l3"]), rank_in=None, rank_out=1)
    else:
        m.add_link(Fn(lambda s, h: s.l2(h), l2=part["l2"]), rank_in=0, rank_out=0)
        m.add_link(Fn(lambda s, h: s.l4(h), l4=part["l4"]), rank_in=0, rank_out=None)
    m.cleargrads()
    if mcomm.rank == 0:
        y0 = m(x)
        np.testing.assert_allclose(y0.array, y0_ref.array, **TOL[np.float64])
        weighted_sum(y0, 1).backward()
        assert_grads(part["l1"], ref["l1"])
        assert_grads(part["l3"], ref["l3"])
    else:
        y1 = m()
        np.testing.assert_allclose(y1.array, y1_ref.array, **TOL[np.float64])
        weighted_sum(y1, 2).backward()
        assert_grads(part["l2"], ref["l2"])
        assert_grads(part["l4"], ref["l4"])


@pytest.mark.mpi(min_size=2)
def test_two_sends_to_one_rank_keep_their_order(mcomm):
    # rank_out=[1, 1] and rank_in=[0, 0]: messages and gradients pair up first in first out.
    ref = layers(sizes=(("l1", 6, 5), ("l2", 6, 5), ("l3", 5, 4)))
    x = data((3, 6), 0)
    part = {k: copy.deepcopy(v) for k, v in ref.items()}
    y_ref = ref["l3"](ref["l1"](x) - 2.0 * F.tanh(ref["l1"](x)))
    weighted_sum(y_ref, 1).backward()
    if mcomm.rank >= 2:
        idle(mcomm)
        return
    m = mnpar.MultiNodeChainList(mcomm)
    if mcomm.rank == 0:
        m.add_link(Fn(lambda s, x: s.l1(x), l1=part["l1"]), rank_in=None, rank_out=[1, 0])
        m.add_link(Fn(lambda s, h: F.tanh(h)), rank_in=0, rank_out=1)
        m.add_link(Fn(lambda s, y: y), rank_in=1, rank_out=None)
    else:
        m.add_link(Fn(lambda s, a, b: s.l3(a - 2.0 * b), l3=part["l3"]), rank_in=[0, 0],
                   rank_out=0)
    run_and_check(mcomm, m, x, y_ref, part, ref, {"l1": 0, "l3": 1})


@pytest.mark.mpi(min_size=2)
def test_evaluation_never_waits_for_backward(mcomm):
    # Forwards under no_backprop_mode / train=False leave nothing behind that a
    # later training step could receive by mistake.
    ref = layers()
    part = {k: copy.deepcopy(v) for k, v in ref.items()}
    x = data((3, 6), 0)
    y_ref = ref["l2"](F.tanh(ref["l1"](x)))
    weighted_sum(y_ref, 1).backward()
    if mcomm.rank >= 2:
        idle(mcomm)
        return
    m = mnpar.MultiNodeChainList(mcomm)
    if mcomm.rank == 0:
        m.add_link(Fn(lambda s, x: F.tanh(s.l1(x)), l1=part["l1"]), rank_in=None, rank_out=1)
        m.add_link(Fn(lambda s, y: y), rank_in=1, rank_out=None)
    else:
        m.add_link(Fn(lambda s, h: s.l2(h), l2=part["l2"]), rank_in=0, rank_out=0)
    for _ in range(2):
        with chainer.no_backprop_mode(), chainer.using_config("train", False):
            out = m(x) if mcomm.rank == 0 else m()
        assert out.creator is None
    with chainer.using_config("train", False):
        out = m(x) if mcomm.rank == 0 else m()  # graph built, backward never called
    run_and_check(mcomm, m, x, y_ref, part, ref, {"l1": 0, "l2": 1})


# -- add_link's checks --------------------------------------------------------


def test_add_link_rejects_out_of_range_ranks(mcomm):
    m = mnpar.MultiNodeChainList(mcomm)
    with pytest.raises(ValueError, match=r"rank_out=5.*out of range.*size"):
        m.add_link(chainer.Link(), rank_in=None, rank_out=5)
    with pytest.raises(ValueError, match=r"rank_in=\[0, -1\].*rank -1 is out of range"):
        m.add_link(chainer.Link(), rank_in=[0, -1])
    with pytest.raises(ValueError, match=rf"rank_in={mcomm.size}"):
        m.add_link(chainer.Link(), rank_in=mcomm.size)
    assert len(m) == 0


def test_add_link_rejects_a_second_output(mcomm):
    m = mnpar.MultiNodeChainList(mcomm)
    m.add_link(chainer.Link(), rank_in=None, rank_out=None)
    with pytest.raises(ValueError, match="component 0 already has rank_out=None"):
        m.add_link(chainer.Link(), rank_in=0, rank_out=None)
    assert len(m) == 1


def test_add_link_rejects_non_links_and_bad_rank_types(mcomm):
    m = mnpar.MultiNodeChainList(mcomm)
    with pytest.raises(TypeError, match="chainer.Link, not function"):
        m.add_link(lambda x: x)
    with pytest.raises(TypeError, match=r"got str '0' in rank_in='0'"):
        m.add_link(chainer.Link(), rank_in="0")
    with pytest.raises(TypeError, match="got bool True"):
        m.add_link(chainer.Link(), rank_out=True)
    with pytest.raises(ValueError, match=r"rank_out=\[\] is empty"):
        m.add_link(chainer.Link(), rank_out=[])


# -- the wiring view ----------------------------------------------------------


def test_wiring_reads_each_components_ranks_as_add_link_normalised_them(mcomm):
    last = mcomm.size - 1
    m = mnpar.MultiNodeChainList(mcomm)
    assert m.wiring == ()
    m.add_link(chainer.Link(), rank_in=None, rank_out=last)
    m.add_link(chainer.Link(), rank_in=[last, 0], rank_out=None)
    assert m.wiring == ((None, (last,)), ((last, 0), None))
    assert m.wiring[1].rank_in == (last, 0) and m.wiring[0].rank_out == (last,)


def test_wiring_cannot_be_changed_behind_the_lists_back(mcomm):
    m = mnpar.MultiNodeChainList(mcomm)
    ranks = [0]
    m.add_link(chainer.Link(), rank_in=ranks, rank_out=None)
    ranks.append(0)  # the caller's list is not the model's
    with pytest.raises(AttributeError):
        m.wiring = ()
    with pytest.raises(TypeError):
        m.wiring[0] = (None, None)
    with pytest.raises(AttributeError):
        m.wiring[0].rank_in = (0, 0)
    with pytest.raises(TypeError):
        m.wiring[0].rank_in[0] = 1
    assert m.wiring == (((0,), None),)
