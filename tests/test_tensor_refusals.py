"""Every misuse of tensor parallelism is refused with a clear error on every rank, before
a wrong number: plans that do not fit, ranks that disagree, functions that are not exact
on parts, random numbers outside a scope, labels and ids outside the vocabulary."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from helpers import Fn
from tensor_models import LM, MLP
from tensor_twins import build
from test_tensor_parallelize import LM_SIZES, lm_plan, tokens

import mnpar
from mnpar.tensor import Channel, Column, Row, TensorParallelError

pytestmark = pytest.mark.mpi(min_size=1)
T = mnpar.tensor


def mlp():
    return build(lambda: L.Classifier(MLP(5, 8, 3, 4)))


def split(comm, forward, plan=None, **links):
    """A model of ``links`` (made by the given functions, from one seed) whose forward is
    ``forward(self, x)``, split over ``comm``."""
    model = build(lambda: Fn(forward, **{k: make() for k, make in links.items()}))
    return T.parallelize(model, comm, plan or {"a": "column"})


X = np.random.RandomState(0).standard_normal((3, 5))


@pytest.mark.parametrize("plan, error, match", [
    ({"predictor/nope": "column"}, TensorParallelError,
     r"parallelize: the plan's pattern 'predictor/nope' matches no link of Classifier; its "
     r"links are /predictor, /predictor/l0, /predictor/l1, /predictor/l2"),
    ({"predictor/l0": "diagonal"}, TypeError,
     r"parallelize: the plan maps 'predictor/l0' to 'diagonal'; a style is one of 'column', "
     r"'row', 'vocab', 'channel_out', 'channel_in', 'channel', 'replicate'"),
    ({"predictor": "column"}, TensorParallelError,
     r"the plan splits '/predictor' Column\(unit=1, gather_output=False, sequence=None\), "
     r"which applies to chainer.links.Linear, not tensor_models.MLP"),
    ({"predictor/l0": Channel()}, TensorParallelError,
     r"applies to chainer.links.BatchNormalization, not "
     r"chainer.links.connection.linear.Linear"),
    ({"predictor/l0": Column(unit=3)}, TensorParallelError,
     r"Linear '/predictor/l0' planned Column\(unit=3, gather_output=False, sequence=None\): "
     r"its 8 output features are no whole number of units of 3"),
    ({"predictor/l*": "column", "predictor/l1": "row"}, TensorParallelError,
     r"'/predictor/l1' is split Column\(.*\) by pattern 'predictor/l\*' and Row\(unit=1, "
     r"sequence=None\) by pattern 'predictor/l1'"),
    ({0: "column"}, TypeError, "plan keys are link path patterns"),
    (["predictor/l0"], TypeError, "plan must be a dict of link path patterns to styles, not "
                                  "list"),
])
def test_plans_that_do_not_fit_are_refused_before_anything_changes(mcomm, plan, error, match):
    model = mlp()
    before = {n: p.array.copy() for n, p in model.namedparams()}
    with pytest.raises(error, match=match):
        T.parallelize(model, mcomm, plan)
    assert type(model) is L.Classifier and type(model.predictor.l0) is L.Linear
    for n, p in model.namedparams():
        np.testing.assert_array_equal(p.array, before[n])


def test_style_arguments_are_checked(mcomm):
    with pytest.raises(TypeError, match=r"Column\(unit=...\) must be an int of at least 1, "
                                        r"not 0"):
        Column(unit=0)
    with pytest.raises(TypeError, match="sequence must be an axis"):
        Row(sequence="T")
    with pytest.raises(TypeError, match="parallelize needs a mnpar.Mesh or an mnpar "
                                        "communicator, not Intracomm"):
        T.parallelize(mlp(), mcomm.mpi_comm, {})
    with pytest.raises(TypeError, match="parallelize needs a chainer.Link, not function"):
        T.parallelize(mlp, mcomm, {})
    model = T.parallelize(mlp(), mcomm, {"predictor/l0": "column"})
    with pytest.raises(TensorParallelError, match="parallelize: Classifier is split already"):
        T.parallelize(model, mcomm, {})


@pytest.mark.mpi(min_size=2)
def test_a_layer_narrower_than_the_group_is_refused(mcomm):
    with pytest.raises(TensorParallelError, match=rf"its 1 output features make only 1, fewer "
                                                  rf"than the {mcomm.size} ranks of the "
                                                  "tensor group"):
        T.parallelize(build(lambda: MLP(3, 1, 2)), mcomm, {"l0": "column"})


@pytest.mark.mpi(min_size=2)
def test_ranks_with_another_plan_or_model_are_refused_on_every_rank(mcomm):
    plan = {"predictor/l0": "column" if mcomm.rank == 0 else "row"}
    with pytest.raises(TensorParallelError, match=r"rank 1 of the tensor group has another "
                                                  r"plan than rank 0"):
        T.parallelize(mlp(), mcomm, plan)
    np.random.seed(mcomm.rank)
    other = L.Classifier(MLP(5, 8, 3, 4))
    with pytest.raises(TensorParallelError, match=r"rank 1 of the tensor group holds another "
                                                  r"model than rank 0 \('/predictor/l0/W'.*"
                                                  r"build the model alike on every rank"):
        T.parallelize(other, mcomm, {"predictor/l0": "column"})


def h_of(s, x):
    return s.a(x)


@pytest.mark.parametrize("forward, match", [
    (lambda s, x: F.sum(F.batch_l2_norm_squared(s.a(x))),
     r"F.batch_l2_norm_squared \(BatchL2NormSquared\) in the forward of Fn cannot run on parts "
     r"split over the tensor group: it is not known to be exact on parts split over the "
     r"tensor group; gather the parts first \(mnpar.functions.gather_from_group"),
    (lambda s, x: F.max(s.a(x), axis=1),
     r"F.max \(Max\) in the forward of Fn cannot run on parts .*: it reduces over the cut "
     r"axis 1"),
    (lambda s, x: F.sum(F.softmax(s.a(x), axis=1)),
     r"F.softmax \(Softmax\) .*: it works along the cut axis 1"),
    (lambda s, x: s.a(x),
     r"the forward of Fn \(split by mnpar.tensor.parallelize\) returns a part, not a whole "
     r"array: its output \(a part of axis 1 \(cut \(0(, \d+)+\)\)\); plan its last layer"),
    (lambda s, x: F.sum(s.b(s.a(x))),
     r"Linear '/b' planned Column\(.*\): its input is a part of axis 1 \(cut .*\), not "
     r"whole; a column layer takes a whole input"),
    (lambda s, x: F.sum(s.a(x) + np.ones(12)),
     r"F.add \(Add\) .*: its input 1 \(shape \(12,\)\) is whole on every rank and runs along "
     r"the cut axis with 12 entries, but the cut axis has 8"),
    (lambda s, x: F.sum(F.reshape(s.a(x), (8, 3))),
     r"F.reshape \(Reshape\) .*: its target shape \(8, 3\) does not keep this rank's part "
     r"of the whole \(3, 8\) cut along axis 1"),
    (lambda s, x: F.sum(F.matmul(s.a(x), s.a(x), transb=True)),
     r"F.matmul \(MatMul\) .*: its parts meet along the contracted axis"),
    (lambda s, x: F.sum(F.dropout(s.a(x), 0.5)),
     r"F.dropout \(Dropout\) in the forward of Fn cannot run on parts split over the tensor "
     r"group: it draws random numbers, and outside mnpar.random.scope every rank of the group "
     r"would draw its own .*wrap the training in mnpar.random.scope\(model, optimizer"),
    (lambda s, x: F.sum(F.dropout(x, 0.5)),
     r"F.dropout \(Dropout\) in the forward of Fn .*outside mnpar.random.scope"),
    (lambda s, x: F.sum(F.gumbel_softmax(s.a(x))),
     r"F.gumbel_softmax in the forward of Fn .*outside mnpar.random.scope"),
], ids=["unknown", "max", "softmax", "output", "column after column", "whole along the cut",
        "reshape", "contracted", "dropout on a part", "dropout on a whole value", "gumbel"])
def test_functions_that_are_not_exact_on_parts_are_refused(mcomm, forward, match):
    model = split(mcomm, forward, {"a": "column", "b": "column"}, a=lambda: L.Linear(5, 8),
                  b=lambda: L.Linear(8, 5))
    with chainer.using_config("train", True):
        with pytest.raises(TensorParallelError, match=match):
            model(X)


def test_a_split_link_called_alone_is_refused(mcomm):
    model = split(mcomm, h_of, a=lambda: L.Linear(5, 8))
    with pytest.raises(TensorParallelError, match=r"Linear '/a' planned Column\(.*\): a split "
                                                  r"link runs only inside the forward of the "
                                                  r"model given to mnpar.tensor.parallelize"):
        model.a(X)


def test_labels_and_ids_outside_the_vocabulary_are_refused(mcomm):
    model = T.parallelize(build(lambda: L.Classifier(LM(**LM_SIZES))), mcomm, lm_plan())
    x, t = tokens()
    bad = t.copy()
    bad[0] = LM_SIZES["vocabulary"]
    with pytest.raises(TensorParallelError, match=r"F.softmax_cross_entropy "
                                                  r"\(SoftmaxCrossEntropy\) .*: label 11 is "
                                                  r"outside the vocabulary of 11 classes"):
        model(x, bad)
    ids = x.copy()
    ids[0, 0] = -2
    with pytest.raises(TensorParallelError, match=r"EmbedID '/predictor/embed' planned "
                                                  r"Vocab\(sequence=None\): id -2 is outside "
                                                  r"its vocabulary of 11 words"):
        model(ids, t)
    ignored = t.copy()
    ignored[:3] = -1  # the ignore label is no class, and takes no part
    model(x, ignored)


def test_batch_normalization_and_grouped_convolutions_that_cannot_be_cut(mcomm):
    with pytest.raises(TensorParallelError, match=r"BatchNormalization '/a' planned Channel\(\)"
                                                  r": it needs its size given"):
        split(mcomm, h_of, {"a": "channel"}, a=lambda: L.BatchNormalization(axis=(0, 2, 3)))
    with pytest.raises(TensorParallelError, match=r"Convolution2D '/a' planned "
                                                  r"ChannelOut\(gather_output=False\): it is a "
                                                  r"grouped convolution \(groups=2\)"):
        split(mcomm, h_of, {"a": "channel_out"},
              a=lambda: L.Convolution2D(4, 4 * mcomm.size, 3, groups=2))
    model = split(mcomm, lambda s, x: F.sum(s.a(x)), {"a": "channel"},
                  a=lambda: L.BatchNormalization(4 * mcomm.size))
    with pytest.raises(TensorParallelError, match=r"BatchNormalization '/a' planned Channel\(\)"
                                                  r": its input is whole, not its channels "
                                                  r"cut at"):
        model(np.ones((2, 4 * mcomm.size)))
    model = split(mcomm, lambda s, x: F.sum(s.b(s.a(x))), {"a": "channel_out"},
                  a=lambda: L.Convolution2D(2, 2 * mcomm.size, 1),
                  b=lambda: L.BatchNormalization(2 * mcomm.size))
    with pytest.raises(TensorParallelError, match=r"F.batch_normalization "
                                                  r"\(BatchNormalization\) in layer '/b' "
                                                  r"\(BatchNormalization\) .*: its statistics "
                                                  r"would be this rank's part's; plan the link "
                                                  r"'channel'"):
        model(np.ones((2, 2, 3, 3)))


def test_a_split_model_inside_a_spatially_converted_one_is_refused(mcomm):
    np.random.seed(0)
    inner = T.parallelize(Fn(lambda s, x: s.b(F.relu(s.a(x))), a=L.Linear(4, 2 * mcomm.size),
                             b=L.Linear(2 * mcomm.size, 3)), mcomm, {"a": "column", "b": "row"})
    outer = Fn(lambda s, x: F.sum(s.inner(F.mean(s.conv(x), axis=(2, 3)))),
               conv=L.Convolution2D(1, 4, 3, pad=1), inner=inner)
    grid = mnpar.spatial.SpatialGrid(mcomm, (1, mcomm.size))
    mnpar.spatial.convert(outer, grid)
    try:
        with pytest.raises(TensorParallelError, match="a model split by mnpar.tensor.parallelize "
                                                      "runs while another guard runs chainer's "
                                                      "functions"):
            outer(grid.tile(np.ones((1, 1, 4, 2 * mcomm.size), np.float32)))
    finally:
        grid.free()
