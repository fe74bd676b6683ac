"""Which chainer functions are exact on tiles, which have a spatial version, which are refused.

The guard asks ``judge`` about every function node that receives a tile.
The answer is a ``Verdict``: the outputs' marks (the function is exact on
tiles as it is), or a conversion (a spatial implementation computes what the
function computes on the whole image), or a ``Refusal``. A node not listed
here is refused: nothing unknown runs on a tile.

=====================  ===============================================================
kind                   rule
=====================  ===============================================================
pointwise              inputs broadcast as in numpy; an input that is not a tile must
                       be constant along the split axes (extent 1), or a constant of
                       the tile's own shape (no gradient)
channel parameters     parameters laid along axis 1 (PReLU, Swish, fixed batch
                       normalization): they must not reach a split axis
along an axis          softmax, concat, cumsum, flips...: exact unless the axis is split
layout                 transpose, reshape, squeeze...: exact if the split axes stay
                       consecutive, in order, unchanged (``_layout``)
converted              convolutions, deconvolutions, pooling and unpooling, resizing,
                       group and layer normalization, local and fully connected
                       layers on tiles: their spatial versions (``_versions``);
                       reductions over split axes, slices, flips and padding along
                       them: rows moved or reduced over the grid (``_convertible``)
=====================  ===============================================================

Inputs that are not tiles and need a gradient (parameters, values computed
from them) get their gradient summed over the grid by the guard.
"""
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np

from ... import _nodes
from ..._nodes import key
from .._marks import Mark, Tile
from . import _convertible as C
from . import _versions as V
from ._call import GATHER, Call, Refusal, Verdict
from ._verdicts import (
    LOSS_FIX,
    along,
    broadcast_to,
    channel_params,
    class_axis,
    expand_dims,
    fixed_batch_norm,
    huber,
    moved,
    pointwise,
    reduction,
    refuse,
    reshape,
    separate,
    squeeze,
    stack,
    stacked,
    sum_to,
    tile_reps,
    transpose,
    when,
)

# Elementwise (``mnpar._nodes``), the random ones too (each tile draws its slice of the
# whole image's numbers, ``_marks.random_position``), and the LSTMs: elementwise along the
# spatial axes (they interleave their gates along axis 1, the channels).
POINTWISE = _nodes.POINTWISE | _nodes.RANDOM_POINTWISE | {
    "rnn.lstm.LSTM", "rnn.slstm.SLSTM", "rnn.tree_lstm.TreeLSTM"}

CHANNEL = """
activation.prelu.PReLUFunction activation.swish.Swish
""".split()


RULES: Dict[str, Callable[[Call], Verdict]] = {name: pointwise for name in sorted(POINTWISE)}
RULES.update({name: channel_params for name in CHANNEL})
RULES.update({
    "normalization.batch_normalization.FixedBatchNormalization": fixed_batch_norm,
    "normalization.local_response_normalization.LocalResponseNormalization":
        along("", 1),
    "normalization.l2_normalization.NormalizeL2": along("axis"),
    "activation.softmax.Softmax": along("axis"),
    "activation.log_softmax.LogSoftmax": along("axis"),
    "activation.crelu.CReLU": along("axis"),
    "math.cumsum.Cumsum": along("axis"),
    "math.cumprod.Cumprod": along("axis"),
    "array.concat.Concat": along("axis"),
    "array.split_axis.SplitAxis": along("axis"),
    "array.repeat.Repeat": along("axis"),
    "array.permutate.Permutate": along("axis"),
    "array.flip.Flip": C.flip_rule,
    "array.fliplr.FlipLR": C.flip_rule,
    "array.flipud.FlipUD": C.flip_rule,
    "array.hstack.Hstack": stacked("", lambda ndim: 1 if ndim > 1 else 0),
    "array.vstack.Vstack": stacked("", lambda ndim: 0),
    "array.dstack.Dstack": stacked("", lambda ndim: 2),
    "array.tile.Tile": tile_reps,
    "math.sum.Sum": reduction(C.grid_sum),
    "math.average.Mean": reduction(C.grid_mean),
    "math.minmax.Max": reduction(C.grid_max),
    "math.minmax.Min": reduction(C.grid_min),
    "math.minmax.ArgMax": reduction(keep=lambda node: False,
                                    fix="F.max over the split axes is converted; " + GATHER),
    "math.minmax.ArgMin": reduction(keep=lambda node: False,
                                    fix="F.min over the split axes is converted; " + GATHER),
    "math.prod.Prod": reduction(),
    "math.logsumexp.LogSumExp": reduction(keep=lambda node: False),
    "math.sum.SumTo": sum_to,
    "math.batch_l2_norm_squared.BatchL2NormSquared": reduction(
        keep=lambda node: False, axes_of=lambda call: tuple(range(1, call.ndim)),
        fix="F.sum(h * h, axis=(1, 2, 3)) is converted; " + GATHER),
    "array.reshape.Reshape": reshape,
    "array.transpose.Transpose": transpose,
    "array.swapaxes.Swapaxes": moved(lambda n, a: np.swapaxes(a, n.axis1, n.axis2)),
    "array.moveaxis.Moveaxis": moved(lambda n, a: np.moveaxis(a, n.source, n.destination)),
    "array.rollaxis.Rollaxis": moved(lambda n, a: np.rollaxis(a, n.axis, n.start)),
    "array.expand_dims.ExpandDims": expand_dims,
    "array.squeeze.Squeeze": squeeze,
    "array.stack.Stack": stack,
    "array.separate.Separate": separate,
    "array.broadcast.BroadcastTo": broadcast_to,
    "array.get_item.GetItem": C.get_item_rule,
    "array.pad.Pad": C.pad_rule,
    "array.resize_images.ResizeImages": V.resize_rule,
    "normalization.group_normalization.GroupNormalization": V.group_norm_rule,
    "normalization.layer_normalization.LayerNormalization": V.layer_norm_rule,
    "connection.linear.LinearFunction": V.linear_rule,
    "connection.local_convolution_2d.LocalConvolution2DFunction": V.local_conv_rule,
    "loss.huber_loss.HuberLoss": huber,
    "loss.sigmoid_cross_entropy.SigmoidCrossEntropy": when("reduce", ("no",), pointwise,
                                                           LOSS_FIX),
    "loss.softmax_cross_entropy.SoftmaxCrossEntropy": when("reduce", ("no",), class_axis,
                                                           LOSS_FIX),
    "normalization.batch_normalization.BatchNormalization": refuse(
        "it normalizes over this rank's pixels only",
        "use chainer.links.BatchNormalization (convert makes it spatial) or "
        "mnpar.spatial.BatchNormalization"),
    "util.forget.Forget": refuse("it runs its function out of the guard's sight",
                                 "call the function directly"),
})
RULES.update({name: V.window_rule(window, what) for name, (window, what) in V.WINDOWS.items()})
for _name in ("loss.mean_squared_error.MeanSquaredError",
              "loss.mean_absolute_error.MeanAbsoluteError",
              "loss.softmax_cross_entropy.SoftmaxCrossEntropy_", "evaluation.accuracy.Accuracy"):
    RULES.setdefault(_name, refuse("it reduces over the whole array", LOSS_FIX))


# Functions of one sample at a time: exact on batch tiles (whole images of some samples)
PER_SAMPLE = """
connection.convolution_2d.Convolution2DFunction connection.convolution_nd.ConvolutionND
connection.deconvolution_2d.Deconvolution2DFunction connection.deconvolution_nd.DeconvolutionND
connection.linear.LinearFunction connection.local_convolution_2d.LocalConvolution2DFunction
connection.shift.Shift pooling.max_pooling_nd.MaxPoolingND
pooling.average_pooling_2d.AveragePooling2D pooling.average_pooling_nd.AveragePoolingND
pooling.unpooling_2d.Unpooling2D pooling.unpooling_nd.UnpoolingND
pooling.upsampling_2d.Upsampling2D array.resize_images.ResizeImages array.im2col.Im2Col
array.depth2space.Depth2Space array.space2depth.Space2Depth
array.spatial_transformer_sampler.SpatialTransformerSampler
normalization.group_normalization.GroupNormalization
normalization.layer_normalization.LayerNormalization
""".split()


def per_sample(call: Call) -> Verdict:
    """A batch tile through a function of one sample at a time: a batch tile again."""
    grid, extents = call.mark.grid, call.mark.extents
    return Verdict(lambda outputs: [Tile(grid, extents, len(y.shape) - 1) for y in outputs])


def judge(node: Any, inputs: Sequence[Any], marks: Sequence[Optional[Mark]]) -> Verdict:
    """The verdict on ``node`` receiving ``inputs`` (some of them tiles).

    Raises:
        Refusal: the node cannot run on these tiles.
    """
    call = Call(node, inputs, marks)
    name = key(node)
    if isinstance(call.mark, Tile) and call.grid.batch and name in PER_SAMPLE and \
            call.first == 0:
        return per_sample(call)
    rule = RULES.get(name)
    if rule is None:
        raise Refusal("it is not known to be exact on tiles",
                      "call mnpar.spatial.gather(h, grid) first, or its spatial version if "
                      "mnpar.spatial has one")
    return rule(call)
