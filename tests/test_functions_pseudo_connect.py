"""pseudo_connect in one process: identity forward, delegate joins backward."""
import chainer
import chainer.functions as F
import numpy as np
import pytest

from mnpar import functions as mf


class CountBackward(chainer.FunctionNode):
    """Identity that counts its backward calls (stands in for a send)."""

    calls = 0

    def forward(self, inputs):
        return inputs[0].copy(),

    def backward(self, indexes, grad_outputs):
        CountBackward.calls += 1
        return grad_outputs


def test_outputs_are_the_actual_values_and_gradients_pass_through():
    x = chainer.Variable(np.arange(3.0))
    z = chainer.Variable(np.ones(2))
    delegate = CountBackward().apply((chainer.Variable(np.zeros(0)),))[0]
    y1, y2 = mf.pseudo_connect(delegate, x * 2, z)
    np.testing.assert_array_equal(y1.array, np.arange(3.0) * 2)
    before = CountBackward.calls
    (F.sum(y1 * y1) + F.sum(y2)).backward()
    assert CountBackward.calls == before + 1  # the delegate's graph was walked
    np.testing.assert_array_equal(x.grad, 8 * np.arange(3.0))
    np.testing.assert_array_equal(z.grad, np.ones(2))


def test_none_delegate_and_arrays():
    y, = mf.pseudo_connect(None, np.ones(2, np.float16))
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y.array, np.ones(2))


def test_needs_an_actual_variable():
    with pytest.raises(ValueError, match="at least one actual variable"):
        mf.pseudo_connect(chainer.Variable(np.zeros(0)))
