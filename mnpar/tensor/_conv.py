"""Convolutions split by channels, and batch normalization cut alike.

::

    channel_out: each rank holds its output channels' filters (W rows, b)
        x (whole) -> copy_to_group -> conv(x, W_r, b_r) = this rank's output channels
    channel_in: each rank holds every filter's slice of its input channels
        x_r (channels cut) -> conv(x_r, W_r) -> reduce_from_group -> + b

The sum over the input channels is the convolution itself: every output
channel sees every input channel, so the result is the convolution the
layer computes in one process, not a grouped one (a grouped convolution, as
ChainerMN's channel-parallel example computes, is a different model with a
fraction of the connections). An output-split convolution followed by an
input-split one costs one allreduce forward and one backward.

Batch normalization on channel parts (``Channel``) holds its channels'
scale, shift and running statistics: the statistics of a channel are one
process's, as each channel's values are all on one rank.
"""
from typing import Any, Dict

import chainer.functions as F
import chainer.links as L

from ..functions._conjugate import GatherFromGroup, ReduceFromGroup, ScatterToGroup
from ._guard import copied
from ._marks import mark, trusted
from ._params import Cut, initialize_cut
from ._split_link import Split


class _Convolution(Split):
    """What the split convolutions read of chainer's link."""

    W: Any
    b: Any
    groups: int
    out_channels: int


class _ChannelOut(_Convolution):
    def _tp_split(self, gather_output: bool) -> None:
        if self.groups != 1:
            raise self._tp_error(f"it is a grouped convolution (groups={self.groups})")
        self._tp_gather = gather_output
        self._tp_channels = self._tp_bounds(self.out_channels, 1, "output channels")
        self._tp_cut(("W", "b"), 0, self._tp_channels)

    def _initialize_params(self, in_channels: int) -> None:
        initialize_cut(self.W, (self.out_channels, in_channels) + _kernel(self))

    def forward(self, x: Any) -> Any:
        self._tp_running()
        m = self._tp_mark(x)
        if m is not None:
            raise self._tp_error(f"its input is {m.describe()}, not whole (plan it "
                                 "'channel_in' to take a part of the input channels)")
        x = copied(self._tp_comm, x)
        with trusted():
            y = super().forward(x)  # type: ignore[misc]
            if self._tp_gather:
                return GatherFromGroup(self._tp_comm, 1).apply((y,))[0]
        return mark(y, self._tp_shard(1, self.out_channels, self._tp_channels))


class _ChannelIn(_Convolution):
    def _tp_split(self) -> None:
        if self.groups != 1:
            raise self._tp_error(f"it is a grouped convolution (groups={self.groups})")
        self._tp_in: Any = None
        if self.W.array is not None:
            self._tp_cut_in(self.W.shape[1])

    def _tp_cut_in(self, channels: int) -> None:
        self._tp_in = self._tp_bounds(channels, 1, "input channels")
        self._tp_cut(("W",), 1, self._tp_in)

    def forward(self, x: Any) -> Any:
        self._tp_running()
        comm, m = self._tp_comm, self._tp_mark(x)
        channels = m.total if m is not None else x.shape[1]
        if self.W.array is None:
            self._tp_cut_in(channels)
            initialize_cut(self.W, (self.out_channels, channels) + _kernel(self))
        if m is None:
            with trusted():
                x = ScatterToGroup(comm, 1, self._tp_in).apply((x,))[0]
        elif m.axis != 1 or m.pre != 1 or m.bounds != self._tp_in:
            raise self._tp_error(f"its input is {m.describe()}, not its input channels cut "
                                 f"at {self._tp_in} (plan the convolution before it "
                                 "'channel_out')")
        with trusted():
            y = _convolve(self, x)
            y = ReduceFromGroup(comm).apply((y,))[0]
            if self.b is not None:
                shape = (1, -1) + (1,) * (y.ndim - 2)
                y = y + F.broadcast_to(F.reshape(self.b, shape), y.shape)
        return y


def _kernel(link: Any) -> tuple:
    k = link.ksize
    nd = len(link.stride) if isinstance(link, L.ConvolutionND) else 2
    return tuple(k) if isinstance(k, (tuple, list)) else (k,) * nd


def _convolve(link: Any, x: Any) -> Any:
    """The link's convolution without its bias."""
    if isinstance(link, L.Convolution2D):
        return F.convolution_2d(x, link.W, None, link.stride, link.pad, dilate=link.dilate,
                                groups=link.groups, cudnn_fast=link.cudnn_fast)
    return F.convolution_nd(x, link.W, None, link.stride, link.pad,
                            cover_all=link.cover_all, dilate=link.dilate, groups=link.groups)


_CLASSES: Dict[Any, type] = {}


def split_class(base: type, side: str) -> type:
    """The split subclass of ``L.Convolution2D`` or ``L.ConvolutionND`` (``'out'``/``'in'``)."""
    key = (base, side)
    if key not in _CLASSES:
        mixin = _ChannelOut if side == "out" else _ChannelIn
        name = f"Channel{side.capitalize()}{base.__name__}"
        _CLASSES[key] = type(name, (mixin, base), {"__module__": __name__})
    return _CLASSES[key]


class ChannelBatchNormalization(Split, L.BatchNormalization):
    """``L.BatchNormalization`` holding its part of the channels (axis 1)."""

    gamma: Any

    def _tp_split(self) -> None:
        if self.axis is not None or self.gamma.array is None or len(self.gamma.shape) != 1:
            raise self._tp_error("it needs its size given and the default axis (a "
                                 "per-channel batch normalization)")
        self._tp_channels = self._tp_bounds(self.gamma.shape[0], 1, "channels")
        self._tp_cut(("gamma", "beta"), 0, self._tp_channels)
        cut = Cut(self._tp_comm, 0, self._tp_channels)
        for name in ("avg_mean", "avg_var"):
            setattr(self, name, cut.part(getattr(self, name)))
        self._tp_persistent_cut = {"avg_mean": cut, "avg_var": cut}

    def forward(self, x: Any, **kwargs: Any) -> Any:
        self._tp_running()
        m = self._tp_mark(x)
        if m is None or m.axis != 1 or m.pre != 1 or m.bounds != self._tp_channels:
            raise self._tp_error(f"its input is {'whole' if m is None else m.describe()}, "
                                 f"not its channels cut at {self._tp_channels}")
        with trusted():
            y = super().forward(x, **kwargs)
        return mark(y, m)
