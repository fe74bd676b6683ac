"""Exact or refused, for every chainer function that takes an image; and random chains of them.

``FUNCTIONS`` lists every public function of ``chainer.functions`` (the
first test fails when chainer has one the table lacks) with what a
converted model does with it on tiles:

=========  ==================================================================
exact      the result and every gradient are one process's (float64, 1e-10)
converted  likewise, through mnpar's spatial version
refused    ``SpatialError`` on every rank
random     draws its noise per tile (valid, not one process's draw): exact in
           test mode, where it draws nothing (``gumbel_softmax``: runs)
n/a        takes no image (vectors, sequences, matrices, integer ids)
=========  ==================================================================

Each call gets ``h``, the tile of a convolution's output (N=2, C=4, 7 x 9),
and a link ``p`` of parameters of the shapes the calls need, so every
parameter's gradient is compared too.

The property test draws random chains of convertible, pixel-wise,
channel-wise and reduction functions and links (odd sizes, several grids)
and compares each with one process.
"""
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from spatial_twins import Body, converted, same_as_one_process

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=1)
IMAGE = (2, 3, 7, 9)
N, C, H, W = 2, 4, 7, 9


class P(chainer.Link):
    """Parameters for the calls: per channel, per feature of the flat image, filters."""

    def __init__(self):
        super().__init__()
        rng = np.random.RandomState(3)
        shapes = {"c": (C,), "c2": (C,), "flat": (C * H * W,), "flat2": (C * H * W,),
                  "fc": (3, C * H * W), "local": (2, H - 2, W - 2, C, 3, 3),
                  "local_b": (2, H - 2, W - 2), "conv": (3, C, 3, 3), "dw": (2, C, 3, 3)}
        with self.init_scope():
            for name, shape in shapes.items():
                setattr(self, name, chainer.Parameter(rng.uniform(0.5, 1.5, shape)))


def t_pixels(h):
    """Integer labels of the tile's pixels (N, h, w): every rank's of one whole image."""
    return (np.abs(h.array[:, 0] * 7).astype(np.int32) % 4)


def pos(h):
    return F.softplus(h) + 0.1


E, CV, R, RND, NA = "exact", "converted", "refused", "random", "n/a"

# name: (status, call(h, p)); a name with " (...)" is a further case of the same function
FUNCTIONS = {
    "absolute": (E, lambda h, p: F.absolute(h)),
    "absolute_error": (E, lambda h, p: F.absolute_error(h, h * 0.5 + 1)),
    "accuracy": (R, lambda h, p: F.accuracy(h, t_pixels(h))),
    "add": (E, lambda h, p: F.add(h, h * h, h)),
    "arccos": (E, lambda h, p: F.arccos(F.tanh(h) * 0.9)),
    "arcsin": (E, lambda h, p: F.arcsin(F.tanh(h) * 0.9)),
    "arctan": (E, lambda h, p: F.arctan(h)),
    "arctan2": (E, lambda h, p: F.arctan2(h, h * h + 1)),
    "arctanh": (E, lambda h, p: F.arctanh(F.tanh(h) * 0.9)),
    "argmax": (E, lambda h, p: F.cast(F.argmax(h, axis=1), h.dtype) * F.max(h, axis=1)),
    "argmax (split axis)": (R, lambda h, p: F.argmax(h, axis=2)),
    "argmax_crf1d": (NA, None),
    "argmin": (E, lambda h, p: F.cast(F.argmin(h, axis=1), h.dtype) * F.min(h, axis=1)),
    "argmin (all)": (R, lambda h, p: F.argmin(h)),
    "as_strided": (R, lambda h, p: F.as_strided(h, h.shape, h.array.strides)),
    "average": (CV, lambda h, p: F.average(h, axis=(2, 3))),
    "average (channels, weights)": (E, lambda h, p: F.average(h, axis=1, weights=p.c)),
    "average_pooling_1d": (CV, None),  # signals and volumes: below
    "average_pooling_2d": (CV, lambda h, p: F.average_pooling_2d(h, 3, 2, 1)),
    "average_pooling_3d": (CV, None),  # signals and volumes: below
    "average_pooling_nd": (CV, lambda h, p: F.average_pooling_nd(h, 2, 1, 0, pad_value=None)),
    "batch_det": (NA, None),
    "batch_inv": (NA, None),
    "batch_l2_norm_squared": (R, lambda h, p: F.batch_l2_norm_squared(h)),
    "batch_matmul": (NA, None),
    "batch_normalization": (R, lambda h, p: F.batch_normalization(h, p.c, p.c2)),
    "batch_renormalization": (R, lambda h, p: F.batch_renormalization(
        h, p.c, p.c2, 2.0, 1.0, running_mean=np.zeros(C), running_var=np.ones(C))),
    "bernoulli_nll": (CV, lambda h, p: F.bernoulli_nll(F.sigmoid(h), h)),
    "bias": (E, lambda h, p: F.bias(h, p.c)),
    "bilinear": (NA, None),
    "binary_accuracy": (R, lambda h, p: F.binary_accuracy(h, t_pixels(h)[:, None].repeat(4, 1))),
    "black_out": (NA, None),
    "broadcast": (E, lambda h, p: F.broadcast(h, p.c[:, None, None])[1] * h),
    "broadcast_to": (E, lambda h, p: F.broadcast_to(F.reshape(p.c, (1, C, 1, 1)), h.shape) * h),
    "cast": (E, lambda h, p: F.cast(F.cast(h, np.float32), np.float64)),
    "ceil": (E, lambda h, p: F.ceil(h) * h),
    "cholesky": (NA, None),
    "classification_summary": (R, lambda h, p: F.classification_summary(h, t_pixels(h))[0]),
    "clip": (E, lambda h, p: F.clip(h, -0.5, 0.5)),
    "clipped_relu": (E, lambda h, p: F.clipped_relu(h, 0.7)),
    "concat": (E, lambda h, p: F.concat((h, h * 2), axis=1)),
    "concat (split axis)": (R, lambda h, p: F.concat((h, h), axis=3)),
    "connectionist_temporal_classification": (NA, None),
    "contrastive": (NA, None),
    "convolution_1d": (CV, None),  # signals and volumes: below
    "convolution_2d": (CV, lambda h, p: F.convolution_2d(h, p.conv, None, 2, 1)),
    "convolution_3d": (CV, None),  # signals and volumes: below
    "convolution_nd": (CV, lambda h, p: F.convolution_nd(h, p.conv, None, 1, 2, dilate=2)),
    "copy": (E, lambda h, p: F.copy(h, -1)),
    "cos": (E, lambda h, p: F.cos(h)),
    "cosh": (E, lambda h, p: F.cosh(h)),
    "crelu": (E, lambda h, p: F.crelu(h)),
    "crf1d": (NA, None),
    "cross_covariance": (NA, None),
    "cumprod": (E, lambda h, p: F.cumprod(h, axis=1)),
    "cumprod (split axis)": (R, lambda h, p: F.cumprod(h, axis=2)),
    "cumsum": (E, lambda h, p: F.cumsum(h, axis=0)),
    "cumsum (split axis)": (R, lambda h, p: F.cumsum(h, axis=-1)),
    "deconvolution_1d": (CV, None),  # signals and volumes: below
    "deconvolution_2d": (CV, lambda h, p: F.deconvolution_2d(h, p.conv.transpose(1, 0, 2, 3),
                                                             None, 2, 1)),
    "deconvolution_3d": (CV, None),  # signals and volumes: below
    "deconvolution_nd": (CV, lambda h, p: F.deconvolution_nd(h, p.conv.transpose(1, 0, 2, 3))),
    "decorrelated_batch_normalization": (R, lambda h, p: F.decorrelated_batch_normalization(
        h, groups=2)),
    "decov": (NA, None),
    "deformable_convolution_2d_sampler": (R, lambda h, p: F.deformable_convolution_2d_sampler(
        h, np.zeros((N, 18) + h.shape[2:]), p.conv, pad=1)),
    "depth2space": (R, lambda h, p: F.depth2space(h, 2)),
    "depthwise_convolution_2d": (CV, lambda h, p: F.depthwise_convolution_2d(h, p.dw, None, 1, 1)),
    "det": (NA, None),
    "diagonal": (R, lambda h, p: F.diagonal(h, 0, 2, 3)),
    "digamma": (E, lambda h, p: F.digamma(pos(h) + 1)),
    "dilated_convolution_2d": (CV, lambda h, p: F.dilated_convolution_2d(h, p.conv, None, 1, 2,
                                                                         2)),
    "discriminative_margin_based_clustering_loss": (
        R, lambda h, p: F.discriminative_margin_based_clustering_loss(
            h[:, :2], t_pixels(h) % 2, 0.5, 1.5, 2)[0]),
    "dropout": (RND, lambda h, p: F.dropout(h, 0.3)),
    "dstack": (R, lambda h, p: F.dstack((h, h))),
    "einsum": (R, lambda h, p: F.einsum("nchw->nc", h)),
    "elu": (E, lambda h, p: F.elu(h)),
    "embed_id": (NA, None),  # integer ids; per pixel it is a lookup, not a tile function
    "erf": (E, lambda h, p: F.erf(h)),
    "erfc": (E, lambda h, p: F.erfc(h)),
    "erfcinv": (E, lambda h, p: F.erfcinv(F.sigmoid(h) + 0.5)),
    "erfcx": (E, lambda h, p: F.erfcx(h)),
    "erfinv": (E, lambda h, p: F.erfinv(F.tanh(h) * 0.9)),
    "exp": (E, lambda h, p: F.exp(h)),
    "expand_dims": (E, lambda h, p: F.expand_dims(h, 1)),
    "expand_dims (between split axes)": (R, lambda h, p: F.expand_dims(h, 3)),
    "expm1": (E, lambda h, p: F.expm1(h)),
    "f1_score": (R, lambda h, p: F.f1_score(h, t_pixels(h))[0]),
    "fft": (R, lambda h, p: F.fft((h, h * 2))[0]),
    "fix": (E, lambda h, p: F.fix(h * 3) * h),
    "fixed_batch_normalization": (E, lambda h, p: F.fixed_batch_normalization(
        h, p.c, p.c2, p.c * 0.1, p.c2)),
    "fixed_batch_renormalization": (E, lambda h, p: F.fixed_batch_renormalization(
        h, p.c, p.c2, p.c * 0.1, p.c2)),
    "fixed_decorrelated_batch_normalization": (R, lambda h, p: F.fixed_decorrelated_batch_normalization(  # noqa: E501
        h, np.zeros(2), np.stack([np.eye(2)] * 2), groups=2)),
    "flatten": (R, lambda h, p: F.flatten(h)),
    "flip": (E, lambda h, p: F.flip(h, 1)),
    "flip (split axis)": (CV, lambda h, p: F.flip(h, 3)),
    "fliplr": (E, lambda h, p: F.fliplr(h)),
    "flipud": (E, lambda h, p: F.flipud(h)),
    "floor": (E, lambda h, p: F.floor(h) * h),
    "fmod": (E, lambda h, p: F.fmod(h * 3, np.full(h.shape, 1.3))),
    "forget": (R, lambda h, p: F.forget(F.relu, h)),
    "gaussian": (RND, lambda h, p: F.gaussian(h, h * 0 - 2)),  # noise in test mode too
    "gaussian_kl_divergence": (CV, lambda h, p: F.gaussian_kl_divergence(h, F.tanh(h))),
    "gaussian_nll": (CV, lambda h, p: F.gaussian_nll(h, h * 0.5, F.tanh(h))),
    "get_item": (E, lambda h, p: h[:, 1:3]),
    "get_item (split axes)": (CV, lambda h, p: h[:, :, 1:-1, ::2]),
    "group_normalization": (CV, lambda h, p: F.group_normalization(h, 2, p.c, p.c2)),
    "gumbel_softmax": (RND, lambda h, p: F.gumbel_softmax(h)),
    "hard_sigmoid": (E, lambda h, p: F.hard_sigmoid(h)),
    "hinge": (NA, None),
    "hstack": (E, lambda h, p: F.hstack((h, h))),
    "huber_loss": (E, lambda h, p: F.huber_loss(h, h * h, 0.5, reduce="no")),
    "huber_loss (sum along the second axis)": (E, lambda h, p: F.huber_loss(
        h, h * h, 0.5, reduce="sum_along_second_axis")),
    "identity": (E, lambda h, p: F.identity(h)),
    "ifft": (R, lambda h, p: F.ifft((h, h * 2))[0]),
    "im2col": (R, lambda h, p: F.im2col(h, 3, pad=1)),
    "inv": (NA, None),
    "layer_normalization": (CV, lambda h, p: F.sum(F.layer_normalization(
        F.reshape(h, (N, -1)), p.flat, p.flat2) ** 2, axis=1)),
    "leaky_relu": (E, lambda h, p: F.leaky_relu(h)),
    "lgamma": (E, lambda h, p: F.lgamma(pos(h))),
    "linear": (CV, lambda h, p: F.linear(h, p.fc)),
    "linear_interpolate": (E, lambda h, p: F.linear_interpolate(F.sigmoid(h), h, h * h)),
    "local_convolution_2d": (CV, lambda h, p: F.local_convolution_2d(h, p.local, p.local_b)),
    "local_response_normalization": (E, lambda h, p: F.local_response_normalization(h, 3)),
    "log": (E, lambda h, p: F.log(pos(h))),
    "log10": (E, lambda h, p: F.log10(pos(h))),
    "log1p": (E, lambda h, p: F.log1p(pos(h))),
    "log2": (E, lambda h, p: F.log2(pos(h))),
    "log_ndtr": (E, lambda h, p: F.log_ndtr(h)),
    "log_softmax": (E, lambda h, p: F.log_softmax(h)),
    "logsumexp": (E, lambda h, p: F.logsumexp(h, axis=1)),
    "logsumexp (split axes)": (R, lambda h, p: F.logsumexp(h, axis=(2, 3))),
    "lstm": (E, lambda h, p: F.lstm(h, F.concat((h, h * 2, -h, h * h), axis=1))[1]),
    "matmul": (R, lambda h, p: F.matmul(h, h, transb=True)),
    "max": (CV, lambda h, p: F.max(h, axis=(2, 3))),
    "max (channels)": (E, lambda h, p: F.max(h, axis=1)),
    "max_pooling_1d": (CV, None),  # signals and volumes: below
    "max_pooling_2d": (CV, lambda h, p: F.max_pooling_2d(h, 3, 2)),
    "max_pooling_3d": (CV, None),  # signals and volumes: below
    "max_pooling_nd": (CV, lambda h, p: F.max_pooling_nd(h, 2, 1, 1)),
    "maximum": (E, lambda h, p: F.maximum(h, h * h - 0.5)),
    "maxout": (E, lambda h, p: F.maxout(h, 2)),
    "mean": (CV, lambda h, p: F.mean(h)),
    "mean_absolute_error": (R, lambda h, p: F.mean_absolute_error(h, h * h)),
    "mean_squared_error": (R, lambda h, p: F.mean_squared_error(h, h * h)),
    "min": (CV, lambda h, p: F.min(h, axis=(0, 2, 3))),
    "minimum": (E, lambda h, p: F.minimum(h, h * h - 0.5)),
    "moveaxis": (E, lambda h, p: F.moveaxis(h, 0, 1)),
    "moveaxis (a split axis)": (R, lambda h, p: F.moveaxis(h, 2, 0)),
    "n_step_bigru": (NA, None),
    "n_step_bilstm": (NA, None),
    "n_step_birnn": (NA, None),
    "n_step_gru": (NA, None),
    "n_step_lstm": (NA, None),
    "n_step_rnn": (NA, None),
    "ndtr": (E, lambda h, p: F.ndtr(h)),
    "ndtri": (E, lambda h, p: F.ndtri(F.sigmoid(h) * 0.9 + 0.05)),
    "negative_sampling": (NA, None),
    "normalize": (E, lambda h, p: F.normalize(h)),
    "pad": (CV, lambda h, p: F.pad(h, ((0, 0), (1, 0), (2, 1), (0, 3)), "edge")),
    "pad_sequence": (R, lambda h, p: F.pad_sequence([h, h])),
    "permutate": (E, lambda h, p: F.permutate(h, np.array([2, 0, 3, 1], np.int32), axis=1)),
    "polygamma": (E, lambda h, p: F.polygamma(np.ones(h.shape, np.int32), pos(h) + 1)),
    "precision": (R, lambda h, p: F.precision(h, t_pixels(h))[0]),
    "prelu": (E, lambda h, p: F.prelu(h, p.c)),
    "prod": (E, lambda h, p: F.prod(h, axis=1)),
    "prod (all)": (R, lambda h, p: F.prod(h)),
    "r2_score": (R, lambda h, p: F.r2_score(h, h * h)),
    "recall": (R, lambda h, p: F.recall(h, t_pixels(h))[0]),
    "relu": (E, lambda h, p: F.relu(h)),
    "relu6": (E, lambda h, p: F.relu6(h * 4)),
    "repeat": (E, lambda h, p: F.repeat(h, 2, axis=1)),
    "repeat (split axis)": (R, lambda h, p: F.repeat(h, 2, axis=2)),
    "reshape": (E, lambda h, p: F.reshape(h, (N, 2, 2) + h.shape[2:])),
    "reshape (across pixels)": (R, lambda h, p: F.reshape(h, (N, C, -1))),
    "resize_images": (CV, None),  # float32 only: test_spatial_resize
    "roi_average_align_2d": (R, lambda h, p: F.roi_average_align_2d(
        h, np.array([[0., 0., 4., 4.]]), np.zeros(1, np.int32), 2, 1.0)),
    "roi_average_pooling_2d": (R, lambda h, p: F.roi_average_pooling_2d(
        h, np.array([[0., 0., 4., 4.]]), np.zeros(1, np.int32), 2, 1.0)),
    "roi_max_align_2d": (R, lambda h, p: F.roi_max_align_2d(
        h, np.array([[0., 0., 4., 4.]]), np.zeros(1, np.int32), 2, 1.0)),
    "roi_max_pooling_2d": (R, lambda h, p: F.roi_max_pooling_2d(
        h, np.array([[0., 0., 4., 4.]]), np.zeros(1, np.int32), 2, 1.0)),
    "roi_pooling_2d": (R, lambda h, p: F.roi_pooling_2d(h, np.array([[0., 0., 0., 4., 4.]]), 2,
                                                        2, 1.0)),
    "rollaxis": (E, lambda h, p: F.rollaxis(h, 1)),
    "rrelu": (RND, lambda h, p: F.rrelu(h)),
    "rsqrt": (E, lambda h, p: F.rsqrt(pos(h))),
    "scale": (E, lambda h, p: F.scale(h, p.c, axis=1)),
    "scatter_add": (R, lambda h, p: F.scatter_add(h, (slice(None), 0), h[:, 1])),
    "select_item": (NA, None),
    "selu": (E, lambda h, p: F.selu(h)),
    "separate": (E, lambda h, p: F.separate(h, axis=1)[2]),
    "separate (split axis)": (R, lambda h, p: F.separate(h, axis=2)[0]),
    "shift": (R, lambda h, p: F.shift(h)),
    "sigmoid": (E, lambda h, p: F.sigmoid(h)),
    "sigmoid_cross_entropy": (E, lambda h, p: F.sigmoid_cross_entropy(
        h, t_pixels(h)[:, None].repeat(4, 1) % 2, reduce="no")),
    "sigmoid_cross_entropy (mean)": (R, lambda h, p: F.sigmoid_cross_entropy(
        h, t_pixels(h)[:, None].repeat(4, 1) % 2)),
    "sign": (E, lambda h, p: F.sign(h) * h),
    "simplified_dropconnect": (R, lambda h, p: F.simplified_dropconnect(h, p.fc)),
    "sin": (E, lambda h, p: F.sin(h)),
    "sinh": (E, lambda h, p: F.sinh(h)),
    "slstm": (E, lambda h, p: F.slstm(h, h * 2, F.concat((h, h, -h, h * h), axis=1),
                                      F.concat((h, -h, h, h), axis=1))[1]),
    "softmax": (E, lambda h, p: F.softmax(h)),
    "softmax (split axis)": (R, lambda h, p: F.softmax(h, axis=3)),
    "softmax_cross_entropy": (E, lambda h, p: F.softmax_cross_entropy(h, t_pixels(h),
                                                                      reduce="no")),
    "softmax_cross_entropy (mean)": (R, lambda h, p: F.softmax_cross_entropy(h, t_pixels(h))),
    "softplus": (E, lambda h, p: F.softplus(h)),
    "space2depth": (R, lambda h, p: F.space2depth(h[:, :, :6, :8], 2)),
    "sparse_matmul": (NA, None),
    "spatial_pyramid_pooling_2d": (R, lambda h, p: F.spatial_pyramid_pooling_2d(h, 2, "max")),
    "spatial_transformer_grid": (NA, None),
    "spatial_transformer_sampler": (R, lambda h, p: F.spatial_transformer_sampler(
        h, np.zeros((N, 2) + h.shape[2:]))),
    "split_axis": (E, lambda h, p: F.split_axis(h, 2, axis=1)[1]),
    "split_axis (split axis)": (R, lambda h, p: F.split_axis(h, 2, axis=2)[0]),
    "sqrt": (E, lambda h, p: F.sqrt(pos(h))),
    "square": (E, lambda h, p: F.square(h)),
    "squared_difference": (E, lambda h, p: F.squared_difference(h, h * h)),
    "squared_error": (E, lambda h, p: F.squared_error(h, h * h)),
    "squeeze": (E, lambda h, p: F.squeeze(F.expand_dims(h, 0), axis=0)),
    "squeeze (every axis)": (R, lambda h, p: F.squeeze(h)),
    "stack": (E, lambda h, p: F.stack((h, h * 2), axis=1)),
    "stack (split axis)": (R, lambda h, p: F.stack((h, h * 2), axis=3)),
    "sum": (CV, lambda h, p: F.sum(h, axis=(1, 2, 3), keepdims=True) * h),
    "sum (channels)": (E, lambda h, p: F.sum(h, axis=1)),
    "sum_to": (E, lambda h, p: F.sum_to(h, (1, C) + h.shape[2:])),
    "sum_to (split axes)": (R, lambda h, p: F.sum_to(h, (N, C, 1, 1))),
    "swapaxes": (E, lambda h, p: F.swapaxes(h, 0, 1)),
    "swapaxes (split axes)": (R, lambda h, p: F.swapaxes(h, 2, 3)),
    "swish": (E, lambda h, p: F.swish(h, p.c)),
    "tan": (E, lambda h, p: F.tan(F.tanh(h))),
    "tanh": (E, lambda h, p: F.tanh(h)),
    "tensordot": (R, lambda h, p: F.tensordot(h, h, axes=((2, 3), (2, 3)))),
    "tile": (E, lambda h, p: F.tile(h, (1, 2, 1, 1))),
    "tile (split axis)": (R, lambda h, p: F.tile(h, (1, 1, 2, 1))),
    "transpose": (E, lambda h, p: F.transpose(h, (1, 0, 2, 3))),
    "transpose (split axes)": (R, lambda h, p: F.transpose(h)),
    "transpose_sequence": (R, lambda h, p: F.transpose_sequence([h[0], h[1]])[0]),
    "tree_lstm": (NA, None),
    "triplet": (R, lambda h, p: F.triplet(h, h * 2, h * h)),
    "unpooling_1d": (CV, None),  # signals and volumes: below
    "unpooling_2d": (CV, lambda h, p: F.unpooling_2d(h, 2, cover_all=False)),
    "unpooling_3d": (CV, None),  # signals and volumes: below
    "unpooling_nd": (CV, lambda h, p: F.unpooling_nd(h, 3, 2, 1)),
    "upsampling_2d": (R, lambda h, p: F.upsampling_2d(
        h, np.zeros(h.shape, np.int32), 2, outsize=(2 * h.shape[2], 2 * h.shape[3]))),
    "vstack": (E, lambda h, p: F.vstack((h, h))),
    "where": (E, lambda h, p: F.where(h.array > 0, h, h * h)),
    "zeta": (E, lambda h, p: F.zeta(np.full(h.shape, 2.0), pos(h) + 1)),
    "zoneout": (RND, lambda h, p: F.zoneout(h, h * 2)),
}


def model_of(call):
    return lambda: Body(lambda s, x: call(s.l0(x), s.l1), L.Convolution2D(3, C, 3, pad=1), P())


def test_every_function_of_chainer_functions_is_in_the_table():
    public = {n for n in dir(F) if not n.startswith("_") and callable(getattr(F, n))}
    listed = {name.split(" (")[0] for name in FUNCTIONS}
    assert public - listed == set(), "functions chainer has and the table lacks"
    assert listed - public == set(), "functions the table lists and chainer lacks"


CASES = [name for name, (status, call) in FUNCTIONS.items() if call is not None]


def one_grid(world):
    """One grid per run, all of the world's ranks: 1x1, 1x2, 1x3, 2x2 over the CI's runs."""
    return (2, 2) if world.size == 4 else (1, world.size)


@pytest.mark.parametrize("name", CASES)
def test_a_function_on_tiles_is_exact_or_refused_on_every_rank(world, grids, name):
    grid = grids(one_grid(world))
    status, call = FUNCTIONS[name]
    x = np.random.RandomState(1).standard_normal(IMAGE)
    if status == R:
        model = converted(grid, model_of(call))
        with pytest.raises(S.SpatialError, match="cannot run on tiles of the spatial grid|the "
                           "ranks of the grid pass different arguments"):
            model(grid.tile(x))
    elif name in ("gumbel_softmax", "gaussian"):
        converted(grid, model_of(call))(grid.tile(x))
    elif status == RND:
        with chainer.using_config("train", False):
            same_as_one_process(grid, model_of(call), x)
    else:
        same_as_one_process(grid, model_of(call), x)


class Chain(NamedTuple):
    """A random chain: its ops' names and the model that runs them."""

    names: Tuple[str, ...]
    make: Callable[[], chainer.Link]


# Ops that keep (N, 4, H, W): name -> (link or None, fn(h, link, extents))
OPS: Dict[str, Tuple[Optional[Callable[[], chainer.Link]], Callable[..., Any]]] = {
    "relu": (None, lambda h, k, e: F.relu(h)),
    "tanh": (None, lambda h, k, e: F.tanh(h)),
    "elu": (None, lambda h, k, e: F.elu(h)),
    "softplus - 1": (None, lambda h, k, e: F.softplus(h) - 1),
    "h * h / 4 + h": (None, lambda h, k, e: h * h / 4 + h),
    "maximum": (None, lambda h, k, e: F.maximum(h, h * 0.3)),
    "where": (None, lambda h, k, e: F.where(h.array > 0, h, F.exp(h) - 1)),
    "softmax * h": (None, lambda h, k, e: F.softmax(h) * h),
    "log_softmax": (None, lambda h, k, e: F.log_softmax(h)),
    "normalize": (None, lambda h, k, e: F.normalize(h) * 2),
    "lrn": (None, lambda h, k, e: F.local_response_normalization(h, 3)),
    "channel sum": (None, lambda h, k, e: h + F.sum(h, axis=1, keepdims=True) / 4),
    "maxout": (None, lambda h, k, e: F.maxout(F.concat((h, -h), axis=1), 2)),
    "transpose N, C": (None, lambda h, k, e: F.transpose(F.transpose(h, (1, 0, 2, 3)) * 1.1,
                                                         (1, 0, 2, 3))),
    "minus mean over pixels": (None, lambda h, k, e: h - F.mean(h, axis=(2, 3), keepdims=True)),
    "times max over N, pixels": (None, lambda h, k, e: h * F.max(F.tanh(h), axis=(0, 2, 3),
                                                                 keepdims=True)),
    "plus global average pooling": (None, lambda h, k, e: h + F.broadcast_to(
        F.average_pooling_2d(h, e), h.shape)),
    "max pooling 3, 1, 1": (None, lambda h, k, e: F.max_pooling_2d(h, 3, 1, 1)),
    "average pooling 3, 1, 1": (None, lambda h, k, e: F.average_pooling_2d(h, 3, 1, 1)),
    "pad and crop": (None, lambda h, k, e: F.pad(h, ((0, 0), (0, 0), (2, 1), (1, 2)),
                                                 "reflect")[:, :, 1:-2, 2:-1]),
    "flip": (None, lambda h, k, e: F.flip(F.flip(h, 2) * 0.5 + h, 3)),
    "unpool then pool": (None, lambda h, k, e: F.average_pooling_2d(
        F.unpooling_2d(h, 2, cover_all=False), 2)),
    "Scale": (lambda: L.Scale(axis=1, W_shape=(4,), bias_term=True), lambda h, k, e: k(h)),
    "PReLU": (lambda: L.PReLU((4,)), lambda h, k, e: k(h)),
    "Bias": (lambda: L.Bias(axis=1, shape=(4,)), lambda h, k, e: k(h)),
    "Convolution 3x3": (lambda: L.Convolution2D(4, 4, 3, pad=1), lambda h, k, e: k(h)),
    "Convolution 1x1": (lambda: L.Convolution2D(4, 4, 1), lambda h, k, e: k(h)),
    "Deconvolution 3x3": (lambda: L.Deconvolution2D(4, 4, 3, pad=1), lambda h, k, e: k(h)),
    "BatchNormalization": (lambda: L.BatchNormalization(4), lambda h, k, e: k(h)),
    "GroupNormalization": (lambda: L.GroupNormalization(2, 4), lambda h, k, e: k(h)),
    "LocalConvolution 1x1": (lambda: L.LocalConvolution2D(4, 4, None, 1), lambda h, k, e: k(h)),
}
HEADS: Dict[str, Tuple[Optional[Callable[[], chainer.Link]], Callable[..., Any]]] = {
    "the tile": (None, lambda h, k, e: h),
    "sum": (None, lambda h, k, e: F.sum(h * h)),
    "mean over pixels": (None, lambda h, k, e: F.mean(h, axis=(2, 3))),
    "max over pixels": (None, lambda h, k, e: F.max(h, axis=(2, 3))),
    "tower Linear": (lambda: L.Linear(None, 3), lambda h, k, e: k(h)),
    "layer norm and Linear": (lambda: L.Linear(None, 2), lambda h, k, e: k(
        F.layer_normalization(F.reshape(h, (len(h), -1)), np.ones(h.shape[1] * e[0] * e[1]),
                              np.zeros(h.shape[1] * e[0] * e[1])))),
}


def chain(seed: int, extents: Tuple[int, int]) -> Chain:
    rng = np.random.RandomState(seed)
    names = list(rng.choice(sorted(OPS), rng.randint(3, 7), replace=False))
    names.append(sorted(HEADS)[rng.randint(len(HEADS))])
    steps = [OPS.get(n) or HEADS[n] for n in names]

    def forward(model, x):
        h = model.stem(x)
        for i, (_, fn) in enumerate(steps):
            h = fn(h, getattr(model, f"l{i}", None), extents)
        return h

    def make():
        body = Body(forward)
        with body.init_scope():
            body.stem = L.Convolution2D(3, 4, 3, pad=1)
            for i, (link, _) in enumerate(steps):
                if link is not None:
                    setattr(body, f"l{i}", link())
        return body
    return Chain(tuple(names), make)


SIZES = [(2, 3, 9, 11), (1, 3, 13, 7), (3, 3, 8, 10)]


@pytest.mark.parametrize("seed", range(12))
def test_random_chains_of_convertible_functions_are_one_processes(world, grids, seed):
    grid = grids(one_grid(world))
    size = SIZES[seed % len(SIZES)]
    c = chain(seed, size[2:])
    x = np.random.RandomState(seed).standard_normal(size)
    try:
        same_as_one_process(grid, c.make, x)
    except AssertionError as e:
        raise AssertionError(f"chain {' -> '.join(c.names)} on {size}: {e}") from None


# The 1-d and 3-d versions: signals (N, C, L) on a grid of one axis, volumes on three
SIGNALS = {
    "convolution_1d": lambda h: F.convolution_1d(h, np.ones((3, C, 3)) / 9, None, 1, 1),
    "deconvolution_1d": lambda h: F.deconvolution_1d(h, np.ones((C, 3, 4)) / 9, None, 2, 1),
    "max_pooling_1d": lambda h: F.max_pooling_1d(h, 3, 2),
    "average_pooling_1d": lambda h: F.average_pooling_1d(h, 3, 1, 1),
    "unpooling_1d": lambda h: F.unpooling_1d(h, 2, cover_all=False),
}
VOLUMES = {
    "convolution_3d": lambda h: F.convolution_3d(h, np.ones((3, C, 3, 3, 3)) / 27, None, 1, 1),
    "deconvolution_3d": lambda h: F.deconvolution_3d(h, np.ones((C, 3, 2, 2, 2)) / 9, None, 2),
    "max_pooling_3d": lambda h: F.max_pooling_3d(h, 2),
    "average_pooling_3d": lambda h: F.average_pooling_3d(h, 3, 1, 1),
    "unpooling_3d": lambda h: F.unpooling_3d(h, 2, cover_all=False),
    "sum over the volume": lambda h: F.sum(h, axis=(2, 3, 4)),
    "flip along depth": lambda h: F.flip(h, 2),
}


@pytest.mark.parametrize("name", list(SIGNALS) + list(VOLUMES))
def test_signals_and_volumes_are_exact(world, grids, name):
    volume = name in VOLUMES
    grid = grids((1, 1, world.size) if volume and world.size % 2 else
                 (world.size, 1, 1) if volume else (world.size,))
    ndim = 3 if volume else 1
    x = np.random.RandomState(1).standard_normal((2, 3) + ((7, 5, 9) if volume else (13,)))
    call = (VOLUMES if volume else SIGNALS)[name]
    same_as_one_process(grid, lambda: Body(lambda s, x: call(s.l0(x)), L.ConvolutionND(
        ndim, 3, C, 3, pad=1)), x)
