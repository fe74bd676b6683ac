"""The ready plans: what they split in the test models, and that the models they split
equal one process at the world's degree."""
import chainer
import chainer.links as L
import numpy as np
import pytest
from tensor_models import CNN, LM, MLP
from tensor_twins import Twins
from test_tensor_parallelize import LM_SIZES, data, tokens

import mnpar
from mnpar.tensor import ChannelIn, ChannelOut, Column, Row, TensorParallelError, Vocab

pytestmark = pytest.mark.mpi(min_size=1)
T = mnpar.tensor


def test_mlp_plan_pairs_the_layers_in_path_order():
    model = MLP(*range(3, 15))  # l0 .. l10: l10 after l9, not after l1
    plan = T.mlp_plan(model)
    assert list(plan) == [f"/l{i}" for i in range(10)]
    assert [plan[f"/l{i}"] for i in (0, 1, 8, 9)] == [Column(), Row(), Column(), Row()]


def test_transformer_plan_splits_heads_mlps_and_the_vocabulary():
    model = L.Classifier(LM(**LM_SIZES))
    plan = T.transformer_plan(model)
    block = "/predictor/blocks/1"
    assert plan[f"{block}/attention/key"] == Column(unit=2)
    assert plan[f"{block}/attention/out"] == Row(unit=2)
    assert plan[f"{block}/fc1"] == Column() and plan[f"{block}/fc2"] == Row()
    assert plan["/predictor/embed"] == plan["/predictor/output"] == Vocab()
    assert len(plan) == 2 * 6 + 2
    assert set(T.transformer_plan(model, sequence=True).values()) == {
        Column(unit=2, sequence=1), Row(unit=2, sequence=1), Column(sequence=1),
        Row(sequence=1), Vocab(sequence=1)}
    with pytest.raises(TensorParallelError, match=r"the attention '/predictor/blocks/0/"
                                                  r"attention' has 10 features, not a multiple "
                                                  r"of 3 heads"):
        T.transformer_plan(model, heads=3)


def test_cnn_plan_pairs_convolutions_by_channels():
    plan = T.cnn_plan(CNN())
    assert plan == {"/conv1": ChannelOut(), "/conv2": ChannelIn(), "/conv3": ChannelOut(),
                    "/conv4": ChannelIn(), "/fc1": Column(), "/fc2": Row()}


@pytest.mark.parametrize("sequence", [False, True])
def test_a_model_split_by_a_ready_plan_equals_one_process(mcomm, sequence):
    x, t = tokens()
    make = lambda: L.Classifier(LM(**LM_SIZES))  # noqa: E731
    twins = Twins(mcomm, make, T.transformer_plan(make(), sequence=sequence),
                  optimizer=chainer.optimizers.Adam)
    twins.step(x, t)
    x, t = data(features=6)
    twins = Twins(mcomm, lambda: L.Classifier(MLP(6, 9, 5, 4)),
                  T.mlp_plan(L.Classifier(MLP(6, 9, 5, 4))))
    twins.step(x, t)
    x = np.random.RandomState(4).standard_normal((2, 3, 8, 8))
    twins = Twins(mcomm, lambda: L.Classifier(CNN()), T.cnn_plan(L.Classifier(CNN())))
    twins.step(x, np.array([1, 3], np.int32))
