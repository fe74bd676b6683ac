"""``mnpar.random.scope`` in one process: places, steps, shares, shards and refusals.

A split is simulated here by what the pipeline and tensor code say to the
generator (``batch_share``, ``sharded``): a batch run in pieces draws the
rows of the whole batch's numbers, for every random function chainer has.
"""
import copy
import functools
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from chainer.functions.rnn.n_step_rnn import BaseNStepRNN
from chainer.utils import walker_alias

import mnpar
from mnpar.pipeline._part import Part
from mnpar.random import _draws, _position

R = mnpar.random


class Block(chainer.Chain):
    """A link that calls a random function ``fn(self, h)``; a Linear's weight for the ones
    that take one (a Linear's own product would round a one-row batch otherwise)."""

    def __init__(self, fn, n=6):
        super().__init__()
        self.fn = fn
        with self.init_scope():
            self.l = L.Linear(n, n)
        for p in self.params():
            p.array = p.array.astype(np.float64)

    def forward(self, h):
        return self.fn(self, h)


def noise(x, seed=0):
    return np.random.RandomState(seed).randn(*x)


FUNCTIONS = {
    "dropout": lambda s, h: F.dropout(h, 0.4),
    "gaussian": lambda s, h: F.gaussian(h, F.tanh(h) - 2),
    "rrelu": lambda s, h: F.rrelu(h),
    "zoneout": lambda s, h: F.zoneout(h * 2, h, 0.3),
    "dropconnect": lambda s, h: F.simplified_dropconnect(h, s.l.W, None, 0.3),
    "dropconnect-shared-mask": lambda s, h: F.simplified_dropconnect(
        h, s.l.W, None, 0.3, use_batchwise_mask=False),
    "gumbel_softmax": lambda s, h: F.gumbel_softmax(h, 0.5),
    "reshaped": lambda s, h: F.reshape(F.dropout(F.reshape(h, (-1, 2)), 0.5), h.shape),
}


def run(model, x, shares=None, **scope):
    """``model(x)`` under a scope, whole or in pieces (``shares``: examples per piece)."""
    with R.scope(model, seed=3, **scope):
        if shares is None:
            return model(x).array
        parts, before = [], 0
        for n in shares:
            with _position.batch_share(before, n, len(x)):
                parts.append(model(x[before:before + n]).array)
            before += n
        return np.concatenate(parts)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_a_batch_in_pieces_draws_the_whole_batchs_numbers(name):
    np.random.seed(0)
    model = Block(FUNCTIONS[name])
    x = noise((7, 6))
    whole = run(model, x)
    assert np.array_equal(run(model, x, [3, 4]), whole)
    assert np.array_equal(run(model, x, [1, 2, 2, 2]), whole)
    assert not np.array_equal(run(model, x), model(x).array)  # chainer's own draw differs


def test_every_random_node_class_of_chainer_has_a_row():
    import chainer.functions.activation.rrelu as rrelu
    import chainer.functions.noise as noise_module

    drawing = {rrelu.RReLU}
    for module in vars(noise_module).values():
        for value in vars(module).values() if hasattr(module, "__dict__") else ():
            if isinstance(value, type) and issubclass(value, chainer.FunctionNode) \
                    and not value.__name__.endswith("Grad") and "Grad" not in value.__name__:
                drawing.add(value)
    assert drawing == set(R.NODES), drawing ^ set(R.NODES)


def test_negative_sampling_draws_its_samples_by_place():
    np.random.seed(1)
    link = L.NegativeSampling(6, [5, 3, 2, 4, 1], 3)
    x, t = noise((6, 6)).astype(np.float32), np.array([0, 1, 2, 3, 4, 0], np.int32)

    def samples(shares):
        with R.scope(link, seed=2):
            out, before = [], 0
            for n in shares:
                with _position.batch_share(before, n, len(x)):
                    out.append(link(x[before:before + n], t[before:before + n],
                                    reduce="no", return_samples=True)[1])
                before += n
            return np.concatenate(out)

    assert np.array_equal(samples([6]), samples([2, 4]))
    assert walker_alias.WalkerAlias.__dict__["sample"] is not None
    assert not hasattr(walker_alias.WalkerAlias.sample, "__wrapped__")


def test_a_shard_draws_its_slice_of_the_whole_array():
    class Heads(chainer.Chain):
        def forward(self, a):
            return F.dropout(a, 0.5)

    model = Heads()
    a = noise((2, 6, 5))
    with R.scope(model, seed=1):
        whole = model(a).array
        for start, stop in ((0, 2), (2, 6), (3, 4)):
            with R.sharded(1, start, 6):
                assert np.array_equal(model(a[:, start:stop]).array, whole[:, start:stop])


def test_places_are_paths_in_the_model_so_copies_and_pieces_draw_alike():
    np.random.seed(0)
    model = chainer.Sequential(Block(FUNCTIONS["dropout"]), F.relu,
                               functools.partial(F.dropout, ratio=0.5),
                               Block(FUNCTIONS["gaussian"]))
    x = noise((4, 6))
    whole = run(model, x)
    assert np.array_equal(run(copy.deepcopy(model), x), whole)
    # the same layers as a stage's two parts, each named as the whole's layers
    first, second = Part(model, 0, 2, 0, 0, None, 1), Part(model, 2, 4, 1, 1, 0, None)
    with R.scope(model, seed=3):
        assert np.array_equal(second(first(x)).array, whole)
    # pieces named by their paths in the whole, as MultiNodeChainList ranks name them
    a = chainer.Sequential(model[0], model[1])
    b = chainer.Sequential(model[2], model[3])
    pair = chainer.Sequential(a, b)
    with R.scope(pair, seed=3):
        paired = pair(x).array
    with R.scope({"/0": a, "/1": b}, seed=3):
        assert np.array_equal(b(a(x)).array, paired)
    assert not np.array_equal(paired, whole)  # other paths, other numbers


def test_each_call_of_a_link_and_each_draw_in_it_draws_anew():
    model = Block(lambda s, h: F.dropout(h, 0.5) + F.dropout(h, 0.5))

    class Twice(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.b = model

        def forward(self, x):
            return self.b(x), self.b(x)

    twice = Twice()
    with R.scope(twice, seed=0):
        y1, y2 = twice(np.ones((3, 6), np.float32))
        z1, z2 = twice(np.ones((3, 6), np.float32))
    assert not np.array_equal(y1.array, y2.array)
    assert np.array_equal(y1.array, z1.array) and np.array_equal(y2.array, z2.array)


def test_steps_follow_the_optimizer_and_a_resumed_run_draws_the_same():
    np.random.seed(0)
    model = Block(FUNCTIONS["dropout"])
    optimizer = chainer.optimizers.SGD().setup(model)
    x = noise((5, 6))
    first = run(model, x, optimizer=optimizer)
    optimizer.t += 1
    second = run(model, x, optimizer=optimizer)
    assert not np.array_equal(first, second)
    resumed = chainer.optimizers.SGD().setup(model)
    resumed.t = 1
    assert np.array_equal(run(model, x, optimizer=resumed), second)
    assert np.array_equal(run(model, x), run(model, x))  # without an optimizer: step 0


def test_evaluation_draws_nothing_where_chainer_does_not():
    model = Block(lambda s, h: F.rrelu(F.dropout(h, 0.5)))
    x = noise((3, 6))
    with chainer.using_config("train", False):
        assert np.array_equal(run(model, x), model(x).array)


def test_an_exception_inside_a_forward_leaves_nothing_behind():
    calls = []

    def sometimes_fails(s, h):
        y = F.dropout(h, 0.5)
        if not calls:
            calls.append(1)
            raise RuntimeError("once")
        return y

    model = Block(sometimes_fails)
    x = noise((3, 6))
    with R.scope(model, seed=3):
        with pytest.raises(RuntimeError, match="once"):
            model(x)
        again = model(x).array
    assert np.array_equal(again, run(model, x))
    assert chainer.Sequential.forward.__module__ == "chainer.sequential"


def test_the_scope_puts_back_what_it_swapped_even_after_an_error():
    saved = (chainer.Sequential.__dict__["forward"], F.gumbel_softmax,
             walker_alias.WalkerAlias.__dict__["sample"], np.random.rand)
    with pytest.raises(KeyError):
        with R.scope(Block(FUNCTIONS["dropout"]), seed=0):
            assert F.gumbel_softmax is not saved[1] and np.random.rand is not saved[3]
            raise KeyError("out")
    assert saved == (chainer.Sequential.__dict__["forward"], F.gumbel_softmax,
                     walker_alias.WalkerAlias.__dict__["sample"], np.random.rand)
    assert not R.active()


def test_numpys_own_draws_inside_the_model_are_named_in_one_warning():
    model = Block(lambda s, h: h * np.random.rand(*h.shape))
    x = noise((3, 6))
    with R.scope(model, seed=0):
        with pytest.warns(R.RandomWarning, match=r"numpy.random.rand was drawn inside the "
                                                 r"model \(in /\)"):
            model(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model(x)  # once
            np.random.rand(3)  # outside the model: no word


# Misuse, each refused with what to do.

def test_a_draw_outside_the_named_model_is_refused():
    model = Block(FUNCTIONS["dropout"])
    with R.scope(model, seed=0):
        with pytest.raises(ValueError, match="F.dropout draws outside the links the scope "
                                             "names"):
            F.dropout(noise((2, 3)), 0.5)


def test_a_second_scope_and_bad_arguments_are_refused():
    model = Block(FUNCTIONS["dropout"])
    with R.scope(model):
        with pytest.raises(ValueError, match="a scope is already active"):
            with R.scope(model):
                pass
    with pytest.raises(TypeError, match="names places by a model's links: model is a list"):
        R.scope([model])
    with pytest.raises(TypeError, match="optimizer.t; int has no t"):
        R.scope(model, 3)
    with pytest.raises(TypeError, match="seed=True must be an int"):
        R.scope(model, seed=True)
    with pytest.raises(TypeError, match=r"scope\(data=...\) needs an mnpar communicator"):
        R.scope(model, data=object())
    with pytest.raises(ValueError, match="start must be 0 or more"):
        with R.sharded(0, -1, 4):
            pass


def test_a_share_that_does_not_divide_the_rows_is_refused():
    model = Block(lambda s, h: F.dropout(F.reshape(h, (-1, 3)), 0.5))
    with R.scope(model, seed=0), _position.batch_share(0, 4, 8):
        with pytest.raises(ValueError, match="array of 6 rows in a micro-batch of 4 examples"):
            model(noise((3, 6)))


def test_a_shard_past_its_whole_or_on_a_missing_axis_is_refused():
    model = Block(FUNCTIONS["dropout"])
    with R.scope(model, seed=0):
        with R.sharded(1, 3, 8), pytest.raises(ValueError, match="past its whole length 8"):
            model(noise((2, 6)))
        with R.sharded(2, 0, 8), pytest.raises(ValueError, match="inside sharded.axis=2"):
            model(noise((2, 6)))


def test_cudnns_rnn_dropout_is_refused_and_its_rnn_without_dropout_is_not():
    rnn = BaseNStepRNN.__new__(BaseNStepRNN)  # cuDNN's RNN, as chainer wraps it
    node = chainer.FunctionAdapter(rnn)

    class Rnn(chainer.Link):
        def __init__(self, dropout):
            super().__init__()
            self.dropout = dropout

        def forward(self):
            _draws.give(node, (), R._scope._active.scope)

    for dropout in (0.0, 0.5):
        with R.scope(Rnn(dropout), seed=0):
            if dropout:
                with pytest.raises(ValueError, match="use_cudnn', 'never'"):
                    R._scope._active.scope.places.roots[""]()
            else:
                R._scope._active.scope.places.roots[""]()


def test_an_nstep_rnns_dropout_under_a_batch_split_is_refused():
    np.random.seed(0)
    rnn = L.NStepLSTM(2, 3, 3, 0.5)  # dropout between its two layers
    for p in rnn.params():
        p.array = p.array.astype(np.float64)
    xs = [noise((n, 3)) for n in (3, 2)]
    with R.scope(rnn, seed=0):
        rnn(None, None, xs)  # whole: fine
        with _position.batch_share(0, 2, 4), pytest.raises(
                ValueError, match="sorted by their lengths.*give the RNN dropout 0"):
            rnn(None, None, xs)
