"""Which chainer functions are exact on parts, which have a tensor-parallel version,
which are refused.

The guard asks ``judge`` about every function node that receives a part (an
array cut over the tensor group). A node not listed here is refused: nothing
unknown runs on a part.

==================  ================================================================
kind                rule
==================  ================================================================
pointwise           parts line up from the last axis (numpy broadcasting); a whole
                    input of extent 1 there broadcasts (its gradient summed over the
                    group), one that runs along the cut axis is cut to this rank's part
random              pointwise, drawn as the slice of one process's draw
                    (``mnpar.random.sharded``); refused outside ``mnpar.random.scope``
along an axis       softmax, concat, cumsum, layer normalization's rows...: exact
                    unless the axis is the cut one
reductions          over other axes: exact; ``sum`` and ``mean`` over the cut axis:
                    this rank's sum, then ``reduce_from_group``; others refused
layout              reshape, transpose, squeeze, indexing...: the cut axis moves
                    (``_layout``); refused where it would not stay one cut axis
products            ``matmul`` on a batch axis of both, ``a``'s rows or ``b``'s columns;
                    ``linear``, convolutions and pooling on a batch (or channel) axis
losses              ``softmax_cross_entropy`` and ``accuracy`` over logits cut by
                    class: the vocabulary-parallel versions (``_loss``)
==================  ================================================================
"""
from typing import Any, Callable, Dict, Optional, Sequence

import chainer
import chainer.functions as F
import numpy as np

from .. import _nodes
from .._nodes import key
from ..functions._conjugate import ReduceFromGroup
from . import _verdicts as V
from ._errors import GATHER, Refusal
from ._loss import VocabCrossEntropy, accuracy, check_labels
from ._marks import Shard, array_of

# Elementwise (``mnpar._nodes``) but for the random ones, which draw (``RANDOM``), and
# the special functions below: elementwise too, but never listed in tensor's table (nor in
# docs/tensor.rst's, nor tested on parts), so they are refused on parts as before.
POINTWISE = _nodes.POINTWISE - {
    "math.digamma.DiGamma", "math.erfcinv.ErfcInv", "math.erfcx.Erfcx", "math.erfinv.ErfInv",
    "math.lgamma.LGamma", "math.linear_interpolate.LinearInterpolate", "math.log_ndtr.LogNdtr",
    "math.ndtr.Ndtr", "math.ndtri.Ndtri", "math.polygamma.PolyGamma", "math.zeta.Zeta"}

# Drawn as the slice of one process's draw; refused outside mnpar.random.scope.
RANDOM = _nodes.RANDOM_POINTWISE | {"noise.simplified_dropconnect.SimplifiedDropconnect"}

ALONG = {
    "activation.softmax.Softmax": "axis", "activation.log_softmax.LogSoftmax": "axis",
    "math.cumsum.Cumsum": "axis", "math.cumprod.Cumprod": "axis",
    "normalization.l2_normalization.NormalizeL2": "axis", "array.concat.Concat": "axis",
    "array.split_axis.SplitAxis": "axis", "array.repeat.Repeat": "axis",
    "array.flip.Flip": "axis", "array.permutate.Permutate": "axis",
}

RULES: Dict[str, Callable[[V.Call], V.Verdict]] = {
    name: V.pointwise for name in sorted(POINTWISE)}
RULES.update({name: V.random_pointwise for name in sorted(RANDOM)})
RULES.update({name: V.along(attr) for name, attr in ALONG.items()})


def _sum_over_cut(call: V.Call) -> Any:
    node, x = call.node, call.inputs[0]
    y = F.sum(x, axis=node.axis, keepdims=node.keepdims)
    return ReduceFromGroup(call.comm).apply((y,))


def _mean_over_cut(call: V.Call) -> Any:
    node, x, m = call.node, call.inputs[0], call.mark
    axes = V.norm_axes(node.axis, call.ndim)
    whole = m.whole_shape(call.shapes[0])
    count = 1
    for a in axes:
        count *= whole[a]
    y = F.sum(x, axis=node.axis, keepdims=node.keepdims) * (1.0 / count)
    return ReduceFromGroup(call.comm).apply((y,))


def _class_axis(call: V.Call) -> Shard:
    m = call.mark
    if call.first != 0 or m.axis != 1 or m.pre != 1:
        raise Refusal(f"its scores are {m.describe()}, not cut along the class axis 1",
                      "cut the scores by class (the output layer planned 'column', reshaped "
                      "to (N, classes)), or " + GATHER)
    return m


def _cross_entropy(call: V.Call) -> V.Verdict:
    m, node = _class_axis(call), call.node
    if node.class_weight is not None:
        raise Refusal("it weighs the classes (class_weight)",
                      "use reduce='no' and weigh the losses by label, or " + GATHER)
    if node.reduce not in ("mean", "no"):
        raise Refusal(f"reduce={node.reduce!r}", None)
    check_labels(array_of(call.inputs[1]), m.total, node.ignore_label, "")
    loss = VocabCrossEntropy(m.comm, m.bounds, node.normalize, node.ignore_label, node.reduce)
    return V.Verdict(convert=lambda: loss.apply(call.inputs))


def _accuracy(call: V.Call) -> V.Verdict:
    m = _class_axis(call)
    y, t = (array_of(x) for x in call.inputs)
    return V.Verdict(convert=lambda: (chainer.Variable(
        accuracy(m.comm, m.bounds, y, t, call.node.ignore_label), requires_grad=False),))


LINEAR_FIX = ("plan the layer 'row' (it takes the parts of its input features and sums), "
              "or " + GATHER)
CONV_FIX = ("plan the convolution 'channel_in' (it takes the parts of its input channels and "
            "sums), or " + GATHER)

RULES.update({
    "math.sum.Sum": V.reduction(_sum_over_cut),
    "math.average.Mean": V.reduction(_mean_over_cut),
    "math.minmax.Max": V.reduction(),
    "math.minmax.Min": V.reduction(),
    "math.minmax.ArgMax": V.reduction(keep=lambda node: False),
    "math.minmax.ArgMin": V.reduction(keep=lambda node: False),
    "math.prod.Prod": V.reduction(),
    "math.logsumexp.LogSumExp": V.reduction(keep=lambda node: False),
    "array.reshape.Reshape": V.reshape,
    "array.transpose.Transpose": V.transpose,
    "array.swapaxes.Swapaxes": V.moved(lambda n, a: a.swapaxes(n.axis1, n.axis2)),
    "array.moveaxis.Moveaxis": V.moved(lambda n, a: np.moveaxis(a, n.source, n.destination)),
    "array.rollaxis.Rollaxis": V.moved(lambda n, a: np.rollaxis(a, n.axis, n.start)),
    "array.expand_dims.ExpandDims": V.expand_dims,
    "array.squeeze.Squeeze": V.squeeze,
    "array.stack.Stack": V.stack,
    "array.separate.Separate": V.separate,
    "array.broadcast.BroadcastTo": V.broadcast_to,
    "array.get_item.GetItem": V.get_item,
    "math.matmul.MatMul": V.matmul,
    "connection.linear.LinearFunction": V.on_axes((0,), LINEAR_FIX, " (its input features)"),
    "connection.embed_id.EmbedIDFunction": V.on_axes(tuple(range(8)), GATHER),
    "connection.convolution_2d.Convolution2DFunction": V.on_axes((0,), CONV_FIX),
    "connection.convolution_nd.ConvolutionND": V.on_axes((0,), CONV_FIX),
    "pooling.max_pooling_nd.MaxPoolingND": V.on_axes((0, 1), GATHER, " (a window axis)"),
    "pooling.average_pooling_2d.AveragePooling2D": V.on_axes((0, 1), GATHER),
    "pooling.average_pooling_nd.AveragePoolingND": V.on_axes((0, 1), GATHER),
    "normalization.layer_normalization.LayerNormalization": V.on_axes(
        (0,), GATHER, " (layer normalization normalizes over axis 1)"),
    "loss.softmax_cross_entropy.SoftmaxCrossEntropy": _cross_entropy,
    "evaluation.accuracy.Accuracy": _accuracy,
    "normalization.batch_normalization.BatchNormalization": V.refuse(
        "its statistics would be this rank's part's", "plan the link 'channel' "
        "(mnpar.tensor.Channel: its parameters cut alike), or " + GATHER),
    "util.forget.Forget": V.refuse("it runs its function out of the guard's sight",
                                   "call the function directly"),
})


def is_random(node: Any) -> bool:
    name = key(node)
    if name == "activation.rrelu.RReLU":
        return bool(chainer.config.train)
    return name in RANDOM


def judge(node: Any, inputs: Sequence[Any], marks: Sequence[Optional[Shard]]) -> V.Verdict:
    """The verdict on ``node`` receiving ``inputs`` (some of them parts).

    Raises:
        Refusal: the node cannot run on these parts.
    """
    rule = RULES.get(key(node))
    if rule is None:
        raise Refusal("it is not known to be exact on parts split over the tensor group",
                      GATHER)
    return rule(V.Call(node, inputs, marks))
