"""A backward split into B (the inputs' gradients) and W (the weights'), in one process.

B then W gives what one ``chainer.backward`` gives, for one micro-batch and
for several whose W runs as one; a component whose parameter reaches the
graph through another node cannot be split, and says why.
"""
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

from mnpar.pipeline import PipelineWarning
from mnpar.pipeline._split import (
    Accumulator,
    SplitCheck,
    input_gradients,
    unsplittable,
    weight_gradients,
)


def _component():
    np.random.seed(3)
    return chainer.Sequential(L.Linear(5, 7), F.tanh, L.Linear(7, 4)).to_device("@numpy")


def _float64(link):
    for p in link.params():
        p.array = p.array.astype(np.float64)
    link.cleargrads()  # the float32 zeros chainer allocated go too
    return link


def _inputs(seed, rows=6):
    rng = np.random.RandomState(seed)
    return rng.randn(rows, 5), rng.randn(rows, 4)


def _whole(xs_gys):
    """Input and parameter gradients of one chainer.backward per micro-batch, summed."""
    model = _float64(_component())
    grads_x = []
    for x, gy in xs_gys:
        leaf = chainer.Variable(x)
        y = model(leaf)
        chainer.backward([y], [chainer.Variable(gy)])
        grads_x.append(leaf.grad)
    return grads_x, {name: p.grad for name, p in model.namedparams()}


def _split(xs_gys):
    """The same through B for each micro-batch, then one W for all of them."""
    model = _float64(_component())
    grads_x, works = [], []
    for x, gy in xs_gys:
        leaf = chainer.Variable(x)
        y = model(leaf)
        works.append(input_gradients([y], [chainer.Variable(gy)], [leaf]))
        grads_x.append(leaf.grad)
    assert all(p.grad is None for p in model.params())  # B leaves the weights alone
    weight_gradients(works, Accumulator())
    return grads_x, {name: p.grad for name, p in model.namedparams()}


@pytest.mark.parametrize("microbatches", [1, 2, 3])
def test_b_then_w_gives_the_whole_backward(microbatches):
    xs_gys = [_inputs(seed) for seed in range(microbatches)]
    whole_x, whole_w = _whole(xs_gys)
    split_x, split_w = _split(xs_gys)
    for a, b in zip(split_x, whole_x):
        np.testing.assert_array_equal(a, b)  # B runs the very same nodes
    assert sorted(split_w) == sorted(whole_w) == ["/0/W", "/0/b", "/1/W", "/1/b"]
    for name in whole_w:
        np.testing.assert_allclose(split_w[name], whole_w[name], rtol=1e-12, atol=1e-14)


def test_w_records_only_the_nodes_that_take_a_parameter():
    model = _component()
    leaf = chainer.Variable(np.ones((2, 5), np.float32))
    y = model(leaf)
    work = input_gradients([y], [chainer.Variable(np.ones((2, 4), np.float32))], [leaf])
    assert [type(node).__name__ for node, _ in work] == ["LinearFunction", "LinearFunction"]


def test_the_sum_is_written_in_place_only_once_it_is_its_own():
    param = chainer.Parameter(np.zeros(3))
    returned = np.ones(3)  # an array a function gave back: it may be shared
    sums = Accumulator()
    sums.add(param, returned)
    assert param.grad is returned
    sums.add(param, np.ones(3))
    assert param.grad is not returned and returned.tolist() == [1, 1, 1]
    own = param.grad
    sums.add(param, np.ones(3))
    assert param.grad is own and own.tolist() == [3, 3, 3]


class ReshapedLinear(chainer.Link):
    """``x W^T`` with W reshaped first: its weight reaches the graph through Reshape."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.w = chainer.Parameter(np.ones(20, np.float32))

    def forward(self, x):
        return F.matmul(x, F.reshape(self.w, (4, 5)), transb=True)


def test_a_parameter_reshaped_first_cannot_split_and_says_so_once():
    link = ReshapedLinear()
    leaf = chainer.Variable(np.ones((2, 5), np.float32))
    y = link(leaf)
    assert "Reshape" in unsplittable([y], [leaf])
    assert unsplittable([y], []) == "no input that takes a gradient"
    check = SplitCheck(rank=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not check(0, [y], [leaf])
        assert not check(0, [y], [leaf])
    assert len(caught) == 1 and issubclass(caught[0].category, PipelineWarning)
    assert "rank 1 component 0's backward cannot be split" in str(caught[0].message)
    model = _component()
    leaf = chainer.Variable(np.ones((2, 5), np.float32))
    assert check(1, [model(leaf)], [leaf])  # another component: decided on its own
