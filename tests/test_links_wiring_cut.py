"""What crosses a cut: chainer's type check failing on it is a WiringError naming the cut."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from chainer.utils.type_check import InvalidType

import mnpar
from mnpar import WiringError
from mnpar.links._wiring_cut import cut_error, received_arrays


def type_error(link, x):
    with pytest.raises(InvalidType) as raised:
        link(x)
    return raised.value


def test_a_float64_array_into_a_float32_component_names_both_ranks_and_dtypes():
    link = L.Linear(3, 2)
    x = chainer.Variable(np.ones((4, 3)))
    error = cut_error(1, 0, link, [(0, x)], type_error(link, x))
    assert isinstance(error, WiringError)
    assert str(error).startswith(
        "rank 1 component 0 (Linear) receives float64 from rank 0 through the cut rank 0 -> "
        "rank 1, but its parameters are float32 (chainer's type check of LinearFunction: "
        "expect ")


def test_a_shape_the_first_layer_does_not_take_names_the_shape_beyond_the_batch_axis():
    link = L.Linear(5, 2)
    x = chainer.Variable(np.ones((4, 3), np.float32))
    error = cut_error(2, 1, link, [(1, x)], type_error(link, x))
    assert str(error).startswith(
        "rank 2 component 1 (Linear) cannot take what rank 1 sends it through the cut rank 1 "
        "-> rank 2: an array of shape (4, 3) ((3,) beyond the batch axis), float32 (chainer's "
        "type check of LinearFunction: expect x.shape[1] == W.shape[1], actual 3 != 5)")


def test_a_mistake_inside_the_component_stays_chainers():
    # The received array fits the first layer; the second does not fit the first.
    link = chainer.Sequential(L.Linear(3, 4), L.Linear(5, 2))
    x = chainer.Variable(np.ones((4, 3), np.float32))
    assert cut_error(1, 0, link, [(0, x)], type_error(link, x)) is None


def test_only_what_came_from_another_rank_counts():
    x, y = chainer.Variable(np.ones(2)), chainer.Variable(np.ones(2))
    assert received_arrays(1, (0, 1, 2), (x, y, (x, y))) == [(0, x), (2, x), (2, y)]
    assert received_arrays(1, None, (x,)) == []


# -- under MPI: a ring over every rank, rank 0 both ends -----------------------------


def ring(comm, first, middle):
    """rank 0: ``first`` (-> 1), Linear(4, 2) (<- n-1); rank i: ``middle(i)`` (i-1 -> i+1)."""
    n, r = comm.size, comm.rank
    m = mnpar.MultiNodeChainList(comm)
    if r == 0:
        m.add_link(first, None, 1)
        m.add_link(L.Linear(4, 2), n - 1, None)
    else:
        m.add_link(middle(r), r - 1, (r + 1) % n)
    return m


@pytest.mark.mpi(min_size=2)
def test_a_float64_piece_sending_to_a_float32_piece_is_refused_on_every_rank(mcomm):
    # Regression (issue 40): chainer's "InvalidType ... float32 != float64" on rank 1 said
    # nothing of the cut the float64 came through.
    with chainer.using_config("dtype", np.float64):
        first = L.Linear(3, 4)
    m = ring(mcomm, first, lambda r: L.Linear(4, 4))
    with pytest.raises(WiringError, match=(
            r"rank 1 component 0 \(Linear\) receives float64 from rank 0 through the cut rank "
            r"0 -> rank 1, but its parameters are float32 \(chainer's type check of "
            r"LinearFunction: .*\); build both pieces in one dtype")):
        m(np.ones((2, 3)))


@pytest.mark.mpi(min_size=2)
def test_a_shape_that_does_not_fit_across_a_cut_is_refused_on_every_rank(mcomm):
    m = ring(mcomm, L.Linear(3, 4), lambda r: L.Linear(5 if r == 1 else 4, 4))
    with pytest.raises(WiringError, match=(
            r"rank 1 component 0 \(Linear\) cannot take what rank 0 sends it through the cut "
            r"rank 0 -> rank 1: an array of shape \(2, 4\) \(\(4,\) beyond the batch axis\), "
            r"float32 \(chainer's type check of LinearFunction: expect x.shape\[1\] == "
            r"W.shape\[1\], actual 4 != 5\)")):
        m(np.ones((2, 3), np.float32))


class CastFirst(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(4, 4)

    def forward(self, x):
        return self.l(F.cast(x, np.float32))


@pytest.mark.mpi(min_size=2)
def test_a_component_that_casts_what_it_receives_is_not_refused(mcomm):
    # What a component takes is known only once it runs: nothing is refused beforehand.
    with chainer.using_config("dtype", np.float64):
        first = L.Linear(3, 4)
    m = ring(mcomm, first, lambda r: CastFirst())
    y = m(np.ones((2, 3)))
    if mcomm.rank == 0:
        assert y.dtype == np.float32 and y.shape == (2, 2)
