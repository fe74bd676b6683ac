"""build_stage's parts: values pass between layers as chainer.Sequential passes them.

A layer's tuple is unpacked into the next layer's arguments on one rank and
across a cut alike, so a Sequential with tuple-passing layers trains split as
it trains whole, and one that the whole cannot run fails split with the same
error, its note naming the stage, the layer and the cut.
"""
import re
import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from helpers import float64
from mpi4py import MPI

import mnpar
from mnpar.pipeline import PipelineUpdater, build_stage
from mnpar.pipeline._part import Part
from mnpar.pipeline._schedule import TRAINING_SCHEDULES

pytestmark = pytest.mark.mpi(min_size=1)


class Fork(chainer.Chain):
    """``x -> (x, tanh(x))``: a layer that returns a pair."""

    def forward(self, x):
        return x, F.tanh(x)


class Mix(chainer.Chain):
    """``(a, b) -> (l(a) * b, a + b)``: takes a pair as two arguments, returns one."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(4, 4, initialW=chainer.initializers.Normal(0.5))

    def forward(self, a, b):
        return self.l(a) * b, a + b


def join(a, b):
    return a * 2 - b


def tuple_model():
    """Five layers, two of which hand a pair on: every cut but the last carries one."""
    np.random.seed(3)
    return float64(chainer.Sequential(
        L.Linear(4, 4, initialW=chainer.initializers.Normal(0.5)), Fork(), Mix(), join,
        L.Linear(4, 3, initialW=chainer.initializers.Normal(0.5))))


TUPLE_BALANCE = {1: [5], 2: [2, 3], 3: [2, 1, 2], 4: [2, 1, 1, 1]}  # cut after Fork first


def comm_for_test():
    return mnpar.create_communicator("naive", timeout=30)


@pytest.fixture(scope="module")
def comm():
    c = comm_for_test()
    yield c
    c.finalize()


def data():
    rng = np.random.RandomState(1)
    return rng.randn(7, 4), rng.randint(0, 3, 7).astype(np.int32)


def train_once(comm, model, balance, schedule="1f1b", checkpoint="never", x=None):
    stage = build_stage(model, balance, comm)
    x, t = (data()[0] if x is None else x), data()[1]
    target = L.Classifier(stage) if comm.rank == 0 else stage
    dataset = (chainer.datasets.TupleDataset(x, t) if comm.rank == 0
               else mnpar.datasets.create_empty_dataset(x))
    optimizer = chainer.optimizers.SGD(0.5).setup(target)
    it = chainer.iterators.SerialIterator(dataset, 7, shuffle=False)
    updater = PipelineUpdater(it, optimizer, comm, 3, schedule=schedule, checkpoint=checkpoint)
    try:
        updater.update()
    finally:
        updater.finalize()
    return stage


@pytest.mark.parametrize("checkpoint", ["never", "always"])
@pytest.mark.parametrize("schedule", TRAINING_SCHEDULES)
def test_tuples_cross_cuts_as_the_whole_sequential_passes_them(comm, schedule, checkpoint):
    n = comm.size
    if n not in TUPLE_BALANCE:
        return
    balance = TUPLE_BALANCE[n]
    stage = train_once(comm, tuple_model(), balance, schedule, checkpoint)
    whole = tuple_model()
    x, t = data()
    classifier = L.Classifier(whole)
    chainer.optimizers.SGD(0.5).setup(classifier).update(classifier, x, t)
    start = sum(balance[:comm.rank])
    mine = [p for layer in list(whole)[start:start + balance[comm.rank]]
            if isinstance(layer, chainer.Link) for _, p in sorted(layer.namedparams())]
    ours = [p for layer in stage[0] if isinstance(layer, chainer.Link)
            for _, p in sorted(layer.namedparams())]
    assert len(ours) == len(mine)  # none on a rank of join alone
    for a, b in zip(ours, mine):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a.grad, b.grad, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(a.array, b.array, rtol=1e-10, atol=1e-12)


@pytest.mark.mpi
def test_parts_know_the_whole_and_call_every_layer_through_one_method(comm, monkeypatch):
    # The split-independent random numbers wrap _call_layer: it must see every layer,
    # with its index in the whole model.
    n = comm.size
    if n not in TUPLE_BALANCE:
        return
    model = tuple_model()
    stage = build_stage(model, TUPLE_BALANCE[n], comm)
    part = stage[0]
    assert isinstance(part, Part) and isinstance(part, chainer.Sequential)
    assert part.whole is model and part.whole_start == sum(TUPLE_BALANCE[n][:comm.rank])
    assert part.whole not in list(part.children())
    seen = []
    real = Part._call_layer

    def record(self, index, layer, args):
        assert list(self.whole)[index] is layer
        seen.append(index)
        return real(self, index, layer, args)
    monkeypatch.setattr(Part, "_call_layer", record)
    x = chainer.Variable(np.ones((2, 4)))
    if part.source is not None:  # what the layer before the cut returns, as it crossed
        before = list(model)[part.whole_start - 1]
        x = (x, x) if isinstance(before, (Fork, Mix)) else x
    part(x)
    assert seen == list(range(part.whole_start, part.whole_start + len(part)))


def pair_then(next_layer, n):
    """Linear, a layer that returns a pair, ``next_layer`` (layer 2), Linear, cut for n
    ranks so that the pair crosses a cut to the rank of ``next_layer`` (from 2 ranks);
    also the part (and rank) that holds layer 2."""
    np.random.seed(0)
    model = chainer.Sequential(L.Linear(4, 4), Fork(), next_layer, L.Linear(4, 3))
    balance = {1: [4], 2: [2, 2], 3: [2, 1, 1], 4: [1, 1, 1, 1]}[n]
    return model, balance, {1: 0, 2: 1, 3: 1, 4: 2}[n]


def first_update_failing(model, balance):
    """The first update of ``model`` cut by ``balance``, on float32 data and a fresh
    communicator that ends while the update's error unwinds, as in a program that
    fails: each peer's wait then fails with that error's text. (Fail-fast's hook is set
    aside, so that no peer waits for its abort: these ranks go on to other tests.)"""
    c = comm_for_test()
    hook, sys.excepthook = sys.excepthook, sys.__excepthook__
    try:
        try:
            train_once(c, model, balance, x=data()[0].astype(np.float32))
        finally:
            c.finalize()
    finally:
        sys.excepthook = hook


@pytest.mark.mpi(min_size=1)
def test_a_layer_the_whole_calls_wrongly_fails_split_with_the_same_error():
    # Regression (issue 40): the pair crossed the cut as one argument and
    # ``lambda ya: ya[0]`` took it, so the pipeline trained a model whose whole fails.
    n = MPI.COMM_WORLD.size
    model, balance, part = pair_then(lambda ya: ya[0], n)
    whole, _, _ = pair_then(lambda ya: ya[0], 1)
    with pytest.raises(TypeError) as whole_error:
        whole(np.ones((2, 4), np.float32))
    message = str(whole_error.value)
    assert message.endswith("<lambda>() takes 1 positional argument but 2 were given")
    with pytest.raises((TypeError, mnpar.PeerFinished), match=re.escape(message)) as raised:
        first_update_failing(model, balance)
    assert (raised.type is TypeError) == (MPI.COMM_WORLD.rank == part)
    if raised.type is TypeError:  # the rank of layer 2; the others learn it as it ends
        assert str(raised.value) == message
        note, = raised.value.__notes__
        assert f"rank {part}, part {part} (" in note and "layer 2 (<lambda>)" in note
        if n > 1:
            assert ("called with the 2 values of a tuple ((3, 4) float32, (3, 4) float32) "
                    f"that came through the cut after layer 1, from rank {part - 1}") in note


@pytest.mark.mpi(min_size=2)
def test_a_pair_into_linear_names_the_cut_and_the_tuple():
    n = MPI.COMM_WORLD.size
    model, balance, part = pair_then(L.Linear(4, 4), n)
    with pytest.raises((TypeError, mnpar.PeerFinished),
                       match="Variables do not support <= operator") as raised:
        first_update_failing(model, balance)
    assert (raised.type is TypeError) == (MPI.COMM_WORLD.rank == part)
    if raised.type is TypeError:
        layers = "layers 2 to 3" if n == 2 else "layer 2"
        note, = raised.value.__notes__
        assert note == (
            f"in the pipeline stage of rank {part}, part {part} ({layers} of the whole "
            f"chainer.Sequential), layer 2 (Linear), called with the 2 values of a tuple "
            f"((3, 4) float32, (3, 4) float32) that came through the cut after layer 1, from "
            f"rank {part - 1}, unpacked into its arguments as chainer.Sequential unpacks a "
            f"tuple")
    else:  # the note travels with the failure to the ranks it ends
        assert "that came through the cut after layer 1" in str(raised.value)


class Listed(chainer.Chain):
    def forward(self, x):
        return [x, x]


class Numbered(chainer.Chain):
    def forward(self, x):
        return x, 3


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("layer, match", [
    (Listed(), r"layer 1 \(Listed\) of the whole model, the last of the pipeline stage of "
               r"rank 0, part 0 \(layers 0 to 1 of the whole chainer.Sequential\), returns a "
               r"list, which chainer.Sequential passes to the next layer as one argument, but "
               r"the cut after it to rank 1 carries it as a tuple"),
    (Numbered(), r"layer 1 \(Numbered\) .* returns int in a tuple \(item\[1\]\), which "
                 r"cannot cross the cut after it to rank 1: a cut carries arrays and "
                 r"Variables"),
])
def test_what_a_cut_cannot_carry_as_the_whole_passes_it_is_refused(layer, match):
    np.random.seed(0)
    model = chainer.Sequential(L.Linear(4, 4), layer, lambda *xs: xs[0], L.Linear(4, 3))
    n = MPI.COMM_WORLD.size
    balance = [2, 2] + [0] * 0 if n == 2 else [2, 1] + [1] * (n - 2)
    if sum(balance) != 4:
        return
    with pytest.raises((TypeError, mnpar.PeerFinished), match=match) as raised:
        first_update_failing(model, balance)
    assert (raised.type is TypeError) == (MPI.COMM_WORLD.rank == 0)
