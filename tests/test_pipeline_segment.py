"""What a segment keeps, and the random state a recomputed forward replays: in one process."""
import chainer
import chainer.links as L
import numpy as np
import pytest

from mnpar.pipeline._segment import Segment, as_list, leaf, replaying


def test_replaying_draws_what_the_first_forward_drew_and_then_goes_on():
    np.random.seed(4)
    saved = np.random.get_state()
    first = np.random.rand(3)
    after = np.random.get_state()
    with replaying(saved):
        np.testing.assert_array_equal(np.random.rand(3), first)
    assert np.random.get_state()[1].tolist() == after[1].tolist()


def test_replaying_puts_the_state_back_when_the_forward_raises():
    # Regression: the executor set the saved state and restored it without try/finally,
    # so an error inside a recomputed forward left NumPy replaying an old state.
    np.random.seed(4)
    saved = np.random.get_state()
    np.random.rand(5)
    after = np.random.get_state()
    with pytest.raises(RuntimeError, match="inside"):
        with replaying(saved):
            np.random.rand(2)
            raise RuntimeError("inside the recomputed forward")
    assert np.random.get_state()[1].tolist() == after[1].tolist()
    assert np.random.get_state()[2] == after[2]


def test_a_segment_counts_the_bytes_it_keeps_once_each():
    np.random.seed(0)
    link = L.Linear(8, 4)
    seg = Segment()
    x = leaf(np.ones((3, 8), np.float32))
    seg.inputs = [[x]]
    seg.outputs = link(x)
    # the input (kept as leaf and as the node's input: once) and the output; not W or b
    assert seg.nbytes() == 3 * 8 * 4 + 3 * 4 * 4
    assert Segment().nbytes() == 0


def test_leaves_take_a_gradient_only_where_they_can():
    assert leaf(np.ones(2, np.float32)).requires_grad
    assert not leaf(np.ones(2, np.int32)).requires_grad
    assert as_list((1, 2)) == ([1, 2], True) and as_list(chainer.Variable(np.ones(1)))[1] is False
