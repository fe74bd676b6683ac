"""Split models equal one process (float64, degrees 1 to 4, uneven sizes): outputs, every
gradient, and the parameters after Adam updates."""
import chainer
import chainer.functions as F
import chainer.initializers as I
import chainer.links as L
import numpy as np
import pytest
from helpers import Fn
from tensor_models import CNN, LM, MLP
from tensor_twins import Twins, group_fixture  # noqa: F401 (the fixture 'group')

import mnpar
from mnpar.tensor import Column, Row, Vocab

pytestmark = pytest.mark.mpi(min_size=1)
T = mnpar.tensor


DEGREES = [pytest.param(d, marks=pytest.mark.mpi(min_size=d)) for d in (1, 2, 3, 4)]


def classify(make):
    return lambda: L.Classifier(make())


def data(n=6, features=5, classes=4, seed=1):
    rng = np.random.RandomState(seed)
    return rng.standard_normal((n, features)), rng.randint(0, classes, n).astype(np.int32)


@pytest.mark.parametrize("degree", DEGREES)
def test_an_mlp_split_by_columns_then_rows(group, degree):
    comm = group(degree)
    if comm is None:
        return
    x, t = data()
    twins = Twins(comm, classify(lambda: MLP(5, 7, 3, 4)),
                  {"predictor/l0": "column", "predictor/l1": "row"},
                  optimizer=chainer.optimizers.Adam)
    for _ in range(3):
        twins.step(x, t)


@pytest.mark.parametrize("degree", DEGREES)
def test_column_row_pairs_and_a_gathered_column(group, degree):
    comm = group(degree)
    if comm is None:
        return
    x, t = data(features=6)
    plan = {"l0": "column", "l1": "row", "l2": Column(gather_output=True), "l3": "row"}
    twins = Twins(comm, classify(lambda: MLP(6, 9, 5, 7, 4)),
                  {f"predictor/{k}": v for k, v in plan.items()},
                  optimizer=chainer.optimizers.Adam)
    twins.step(x, t)
    twins.step(x, t)


@pytest.mark.parametrize("degree", DEGREES)
def test_a_lazily_initialized_split_draws_one_process_values(group, degree):
    comm = group(degree)
    if comm is None:
        return
    x, t = data(features=5)
    twins = Twins(comm, classify(lambda: MLP(5, 7, 3, 4, lazy=True)),
                  {"predictor/l0": "column", "predictor/l1": "row"})
    twins.step(x, t)
    twins.step(x, t)


LM_SIZES = dict(vocabulary=11, d=10, heads=5, hidden=10, layers=2, length=5)


def lm_plan(sequence=None):
    heads = LM_SIZES["d"] // LM_SIZES["heads"]
    plan = {"*/query": Column(unit=heads, sequence=sequence),
            "*/key": Column(unit=heads, sequence=sequence),
            "*/value": Column(unit=heads, sequence=sequence),
            "*/attention/out": Row(unit=heads, sequence=sequence),
            "*/fc1": Column(sequence=sequence), "*/fc2": Row(sequence=sequence),
            "predictor/embed": Vocab(sequence=sequence), "predictor/output": Vocab(
                sequence=sequence)}
    return plan


def tokens(batch=2, length=5, seed=3):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, LM_SIZES["vocabulary"], (batch, length + 1)).astype(np.int32)
    return ids[:, :-1], ids[:, 1:].reshape(-1)


@pytest.mark.parametrize("degree", DEGREES)
@pytest.mark.parametrize("sequence", [None, 1], ids=["tensor", "sequence"])
def test_a_transformer_language_model(group, degree, sequence):
    comm = group(degree)
    if comm is None:
        return
    x, t = tokens()
    twins = Twins(comm, classify(lambda: LM(**LM_SIZES)), lm_plan(sequence),
                  optimizer=chainer.optimizers.Adam)
    for _ in range(2):
        twins.step(x, t)
    assert isinstance(twins.ours.predictor.embed, T.VocabEmbedID)


@pytest.mark.parametrize("degree", DEGREES)
def test_a_vgg_style_network_split_by_channels(group, degree):
    comm = group(degree)
    if comm is None:
        return
    x = np.random.RandomState(4).standard_normal((2, 3, 8, 8))
    t = np.array([1, 3], np.int32)
    plan = {"conv1": "channel_out", "conv2": "channel_in", "conv3": "channel_out",
            "conv4": "channel_in", "fc1": "column", "fc2": "row"}
    twins = Twins(comm, classify(CNN), {f"predictor/{k}": v for k, v in plan.items()},
                  optimizer=chainer.optimizers.Adam)
    twins.step(x, t)
    twins.step(x, t)


def scopes_of(twins, seed=3):
    return [mnpar.random.scope(m, o, seed=seed) for m, o in zip((twins.ref, twins.ours),
                                                                twins.optimizers)]


@pytest.mark.parametrize("degree", DEGREES)
@pytest.mark.parametrize("sequence", [None, 1], ids=["tensor", "sequence"])
def test_five_adam_steps_with_dropout_draw_one_process_masks(group, degree, sequence):
    comm = group(degree)
    if comm is None:
        return
    x, t = tokens()
    twins = Twins(comm, classify(lambda: LM(**dict(LM_SIZES, dropout=0.3))), lm_plan(sequence),
                  optimizer=chainer.optimizers.Adam)
    scopes = scopes_of(twins)
    losses = [twins.step(x, t, scopes=scopes)[1] for _ in range(5)]
    assert len({float(loss.array) for loss in losses}) == 5  # each step drew new masks


@pytest.mark.parametrize("degree", DEGREES)
def test_dropout_on_column_parts_of_an_mlp(group, degree):
    comm = group(degree)
    if comm is None:
        return
    x, t = data(features=6)
    twins = Twins(comm, classify(lambda: MLP(6, 9, 5, 4, dropout=0.4)),
                  {"predictor/l0": "column", "predictor/l1": "row"},
                  optimizer=chainer.optimizers.Adam)
    scopes = scopes_of(twins)
    for _ in range(5):
        twins.step(x, t, scopes=scopes)


@pytest.mark.parametrize("degree", DEGREES)
def test_whole_parameters_broadcast_onto_parts(group, degree):
    """``L.Scale`` on column parts (its weight cut to the part) and ``L.Bias`` of one
    value broadcast to them (its gradient summed over the group)."""
    comm = group(degree)
    if comm is None:
        return

    def make():
        return Fn(lambda s, x: F.sum(s.b(s.bias(F.tanh(s.s(s.a(x))))) ** 2),
                  a=L.Linear(5, 8), s=L.Scale(axis=1, W_shape=(8,), bias_term=True),
                  bias=L.Bias(axis=0, shape=(1,)), b=L.Linear(8, 3))
    twins = Twins(comm, make, {"a": "column", "b": "row"}, optimizer=chainer.optimizers.Adam)
    twins.step(data()[0])
    twins.step(data()[0])


@pytest.mark.parametrize("degree", DEGREES)
def test_one_dimensional_convolutions_split_by_channels(group, degree):
    comm = group(degree)
    if comm is None:
        return

    def make():
        return Fn(lambda s, x: F.sum(F.tanh(s.b(F.relu(s.a(x)))) ** 2),
                  a=L.Convolution1D(3, 5, 3, pad=1), b=L.ConvolutionND(1, 5, 4, 2))
    twins = Twins(comm, make, {"a": "channel_out", "b": "channel_in"},
                  optimizer=chainer.optimizers.Adam)
    twins.step(np.random.RandomState(2).standard_normal((2, 3, 7)))


@pytest.mark.parametrize("degree", DEGREES)
@pytest.mark.parametrize("initializer", ["Orthogonal", "GlorotUniform", "HeNormal", "Uniform"])
def test_weights_drawn_at_the_first_forward_are_one_process_draws(group, degree,
                                                                  initializer):
    """Each rank keeps its slice of the whole draw, for any initializer (an orthogonal
    matrix's rows are no draw of their own)."""
    comm = group(degree)
    if comm is None:
        return

    def make():
        m = MLP(6, 9, 5, 4, lazy=True)
        for link in (m.l0, m.l1):
            link.W.initializer = getattr(I, initializer)()
        return L.Classifier(m)
    x, t = data(features=6)
    Twins(comm, make, {"predictor/l0": "column", "predictor/l1": "row"}).step(x, t)
