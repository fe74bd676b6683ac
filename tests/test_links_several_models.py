"""Several MultiNodeChainLists on one communicator, each on a subset of its ranks.

Every test builds the one-process reference of each model (seeded float64
layers) and checks each rank's outputs and gradients against it. Ranks a
test does not use build no model at all: nothing of the others' wiring may
disturb them or be left queued for them at ``finalize()``.
"""
import copy
import gc

import chainer.functions as F
import numpy as np
import pytest
from helpers import Fn, Identity
from test_links_chain_list import data, layers, run_and_check, weighted_sum

import mnpar
from mnpar import WiringError

pytestmark = pytest.mark.mpi(min_size=1)


def reference(*names, final=None):
    """Fresh layers, their copies for the split model, and the reference output.

    The reference applies ``tanh(layer(.))`` for every name but the last and
    ``final`` (default: the plain layer) for the last, then backpropagates
    ``weighted_sum``.
    """
    ref = layers()
    part = {k: copy.deepcopy(v) for k, v in ref.items()}
    y = data((3, 6), 0)
    for name in names[:-1]:
        y = F.tanh(ref[name](y))
    y = ref[names[-1]](y)
    weighted_sum(y, 1).backward()
    return ref, part, y


def pair(comm, rank, a, b, first, second):
    """Rank ``a`` runs ``tanh(first)`` and takes the output back; ``b`` runs ``second``."""
    m = mnpar.MultiNodeChainList(comm)
    if rank == a:
        m.add_link(Fn(lambda s, x: F.tanh(s.l(x)), l=first), rank_in=None, rank_out=b)
        m.add_link(Identity(), rank_in=b, rank_out=None)
    else:
        m.add_link(Fn(lambda s, h: s.l(h), l=second), rank_in=a, rank_out=a)
    return m


def checked_pair(comm, steps=1):
    """The pair l1 | l2 on ranks 0 and 1, run ``steps`` times against one process.

    Returns the model on ranks 0 and 1, None on the others.
    """
    ref, part, y = reference("l1", "l2")
    if comm.rank >= 2:
        return None
    m = pair(comm, comm.rank, 0, 1, part["l1"], part["l2"])
    for _ in range(steps):
        run_and_check(comm, m, data((3, 6), 0), y, part, ref, {"l1": 0, "l2": 1})
    return m


def ring(comm, part):
    """l1 on rank 0, l2 on rank 1, l3 on rank 2, the output back on rank 0."""
    m = mnpar.MultiNodeChainList(comm)
    if comm.rank == 0:
        m.add_link(Fn(lambda s, x: F.tanh(s.l1(x)), l1=part["l1"]), rank_in=None, rank_out=1)
        m.add_link(Identity(), rank_in=2, rank_out=None)
    elif comm.rank == 1:
        m.add_link(Fn(lambda s, h: F.tanh(s.l2(h)), l2=part["l2"]), rank_in=0, rank_out=2)
    else:
        m.add_link(Fn(lambda s, h: s.l3(h), l3=part["l3"]), rank_in=1, rank_out=0)
    return m


@pytest.mark.parametrize("barrier", [True, False])
@pytest.mark.mpi(min_size=3)
def test_a_pair_then_a_ring_with_a_rank_that_sat_out_the_pair(mcomm, barrier):
    # Regression: rank 2 took the pair's wiring, queued for it, for the ring's
    # and raised "rank 2 component 0 receives from rank 1, which never arrives".
    # Without the barrier rank 2 runs ahead: its ring's wiring reaches ranks 0
    # and 1 while they check the pair, and must wait for their ring.
    rank = mcomm.rank
    first = checked_pair(mcomm)  # noqa: F841 - alive while the ring runs, as in the issue
    if barrier:
        mcomm.mpi_comm.Barrier()  # rank 2 and up wait, with the pair's wiring queued
    ref, part, y = reference("l1", "l2", "l3")
    if rank < 3:
        run_and_check(mcomm, ring(mcomm, part), data((3, 6), 0), y, part, ref,
                      {"l1": 0, "l2": 1, "l3": 2})


@pytest.mark.mpi(min_size=2)
def test_models_built_in_different_orders_on_different_ranks(mcomm):
    # P on ranks {0, 1}, Q on ranks {1, q}; rank 1 builds Q first, the others P.
    rank, q = mcomm.rank, (2 if mcomm.size > 2 else 0)
    ref_p, part_p, y_p = reference("l1", "l2")
    ref_q, part_q, y_q = reference("l1", "l2")
    models = {}
    order = ("q", "p") if rank == 1 else ("p", "q")
    for name in order:
        if name == "p" and rank in (0, 1):
            models["p"] = pair(mcomm, rank, 0, 1, part_p["l1"], part_p["l2"])
        if name == "q" and rank in (1, q):
            models["q"] = pair(mcomm, rank, 1, q, part_q["l1"], part_q["l2"])
    for _ in range(2):  # the second step runs without the check
        if "p" in models:
            run_and_check(mcomm, models["p"], data((3, 6), 0), y_p, part_p, ref_p,
                          {"l1": 0, "l2": 1})
        if "q" in models:
            run_and_check(mcomm, models["q"], data((3, 6), 0), y_q, part_q, ref_q,
                          {"l1": 1, "l2": q}, output_rank=1, input_rank=1)


@pytest.mark.mpi(min_size=3)
def test_a_model_on_ranks_one_and_two_while_rank_zero_runs_another(mcomm):
    rank = mcomm.rank
    ref, part, y = reference("l1", "l2")
    if rank in (1, 2):
        m = pair(mcomm, rank, 1, 2, part["l1"], part["l2"])
        run_and_check(mcomm, m, data((3, 6), 0), y, part, ref, {"l1": 1, "l2": 2},
                      output_rank=1, input_rank=1)
    elif rank == 0 and mcomm.size == 3:  # a model of rank 0 alone
        solo = mnpar.MultiNodeChainList(mcomm)
        solo.add_link(Fn(lambda s, x: s.l2(F.tanh(s.l1(x))), l1=part["l1"], l2=part["l2"]))
        run_and_check(mcomm, solo, data((3, 6), 0), y, part, ref, {"l1": 0, "l2": 0})
    elif rank in (0, 3):  # with four ranks, a model of its own on ranks {0, 3}
        m = pair(mcomm, rank, 0, 3, part["l1"], part["l2"])
        run_and_check(mcomm, m, data((3, 6), 0), y, part, ref, {"l1": 0, "l2": 3})


@pytest.mark.mpi(min_size=2)
def test_a_model_rebuilt_for_a_second_phase(mcomm):
    for _phase in range(2):
        m = checked_pair(mcomm, steps=2)
        del m
        gc.collect()  # the old model is gone: the new one is this rank's only model


@pytest.mark.mpi(min_size=2)
def test_a_mismatch_in_a_second_model_is_caught_on_its_ranks_only(mcomm):
    rank = mcomm.rank
    first = checked_pair(mcomm)
    del first
    gc.collect()
    if rank < 2:
        # Both ranks receive first: neither ever sends.
        second = mnpar.MultiNodeChainList(mcomm)
        second.add_link(Fn(lambda s, h: h), rank_in=1 - rank, rank_out=None)
        second.add_link(Fn(lambda s, x: x), rank_in=None, rank_out=1 - rank)
        with pytest.raises(WiringError, match=rf"(?s)rank {rank} component 0 receives from "
                                              rf"rank {1 - rank}.*is itself blocked"):
            second(np.ones(2))
    mcomm.mpi_comm.Barrier()  # the other ranks, untouched, wait here


@pytest.mark.mpi(min_size=2)
def test_a_model_built_after_another_ran_answers_a_wiring_already_announced(mcomm):
    # Rank 1 runs a model of its own first, then builds its half of the pair
    # whose wiring rank 0 announced meanwhile: not a mismatch, nothing to wait for.
    if mcomm.rank == 1:
        solo = mnpar.MultiNodeChainList(mcomm)
        solo.add_link(Fn(lambda s, x: 2 * x))
        np.testing.assert_array_equal(solo(np.ones(2)), np.full(2, 2.0))
        del solo
        gc.collect()  # the pair is then rank 1's only model, checked in full
    checked_pair(mcomm)
