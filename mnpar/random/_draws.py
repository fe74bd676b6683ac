"""chainer's random functions, one row each: what they draw, and how they are given it.

Each function node that draws is given its numbers before its forward runs
(a ``FunctionHook``'s ``forward_preprocess``), through the field chainer
already has for a given mask or noise; it then computes as it always does.
Two draws happen outside any node, so while a scope is active their chainer
functions are swapped (``SWAPS``)::

    node or function          draws             field, or how    axis 0 the batch
    Dropout                   uniform, x        mask             unless x is a parameter
    Gaussian                  normal, ln_var    eps              yes
    RReLU (training)          uniform, x        r                yes
    Zoneout                   uniform, x        its forward      yes
    SimplifiedDropconnect     uniform, mask     mask             the batchwise mask
    gumbel_softmax            uniform, log_pi   swapped          yes
    WalkerAlias.sample        uniform, shape    swapped          yes (NegativeSampling,
                                                                  BlackOut)
    cuDNN's RNN with dropout  its own states    refused: run it with use_cudnn='never'

``Source`` (the scope, or a recomputation's replay) answers ``numbers``.
"""
import functools
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple

import chainer
import numpy as np
from chainer.functions.activation.rrelu import RReLU
from chainer.functions.noise import gumbel_softmax as _gumbel_module
from chainer.functions.noise.dropout import Dropout
from chainer.functions.noise.gaussian import Gaussian
from chainer.functions.noise.simplified_dropconnect import SimplifiedDropconnect
from chainer.functions.noise.zoneout import Zoneout
from chainer.functions.rnn.n_step_rnn import BaseNStepRNN
from chainer.utils import walker_alias


class Source(Protocol):
    def numbers(self, kind: str, shape: Tuple[int, ...], like: Any, batch: bool,
                what: str) -> Any:
        """``kind`` ('uniform' or 'normal') float64 numbers of ``shape`` (on ``like``'s
        device), for the array ``like`` (its position; None: ``shape`` has no array)."""


class Draw(NamedTuple):
    """A node class that draws: its name in errors, and how to give it its numbers."""

    what: str
    give: Callable[[Any, Sequence[Any], Source], None]


def _is_parameter(array: Any) -> bool:
    """``array`` is the array of a parameter of a link being called (weight dropout)."""
    from . import _places

    return _places.holds_parameter(array)


def _dropout(node: Any, inputs: Sequence[Any], source: Source) -> None:
    x = inputs[0]
    if node.mask is not None:
        return
    u = source.numbers("uniform", x.shape, x, not _is_parameter(x), "F.dropout")
    scale = x.dtype.type(1.0 / (1.0 - node.dropout_ratio))
    node.mask = scale * (u >= node.dropout_ratio)


def _gaussian(node: Any, inputs: Sequence[Any], source: Source) -> None:
    mean, ln_var = inputs
    if node.eps is None:
        eps = source.numbers("normal", ln_var.shape, ln_var, True, "F.gaussian")
        node.eps = eps.astype(mean.dtype, copy=False)


def _rrelu(node: Any, inputs: Sequence[Any], source: Source) -> None:
    x = inputs[0]
    if chainer.config.train and node.r is None:
        u = source.numbers("uniform", x.shape, x, True, "F.rrelu")
        node.r = (node.lower + (node.upper - node.lower) * u).astype(x.dtype, copy=False)


def _zoneout_forward(node: Any, flag_x: Any, inputs: Sequence[Any]) -> Tuple[Any]:
    """Zoneout's forward with the flags given (chainer's draws them inside it)."""
    node.retain_inputs(())
    h, x = inputs
    node.flag_x = flag_x
    node.flag_h = ~flag_x
    return h * node.flag_h + x * node.flag_x,


def _zoneout(node: Any, inputs: Sequence[Any], source: Source) -> None:
    x = inputs[1]
    u = source.numbers("uniform", x.shape, x, True, "F.zoneout")
    node.forward = functools.partial(_zoneout_forward, node, u >= node.zoneout_ratio)


def _dropconnect(node: Any, inputs: Sequence[Any], source: Source) -> None:
    if node.mask is not None:
        return
    x, w = inputs[0], inputs[1]
    shape = ((x.shape[0],) if node.use_batchwise_mask else ()) + tuple(w.shape)
    u = source.numbers("uniform", shape, None, node.use_batchwise_mask,
                       "F.simplified_dropconnect")
    node.mask = u >= node.ratio


def is_cudnn_rnn(node: Any) -> bool:
    """``node`` runs cuDNN's RNN (chainer's old-style function, behind an adapter)."""
    return isinstance(node, chainer.FunctionAdapter) and isinstance(node.function, BaseNStepRNN)


def _cudnn_rnn(node: Any, inputs: Sequence[Any], source: Source) -> None:
    from . import _places

    if chainer.config.train and _places.rnn_dropout() != 0:
        raise ValueError(
            "mnpar.random: cuDNN's RNN (F.n_step_lstm, n_step_gru, n_step_rnn on a GPU) draws "
            "its dropout from cuDNN's own generator, whose masks are not one process's; "
            "run it with chainer.using_config('use_cudnn', 'never') (its dropout then goes "
            "through F.dropout, which draws by place), or with dropout 0")


NODES: Dict[type, Draw] = {
    Dropout: Draw("F.dropout", _dropout),
    Gaussian: Draw("F.gaussian", _gaussian),
    RReLU: Draw("F.rrelu", _rrelu),
    Zoneout: Draw("F.zoneout", _zoneout),
    SimplifiedDropconnect: Draw("F.simplified_dropconnect", _dropconnect),
}


def give(node: Any, inputs: Sequence[Any], source: Source) -> None:
    """Gives ``node`` its numbers, if it is one that draws."""
    row = NODES.get(type(node))
    if row is not None:
        row.give(node, inputs, source)
    elif is_cudnn_rnn(node):
        _cudnn_rnn(node, inputs, source)


def gumbel_softmax(source: Source, log_pi: Any, tau: Any = 0.1, axis: int = 1) -> Any:
    """chainer's ``F.gumbel_softmax`` with its Gumbel noise drawn by ``source``."""
    array: Any = log_pi.array if isinstance(log_pi, chainer.Variable) else log_pi
    xp = chainer.backend.get_array_module(array)
    if array.ndim < 1:
        return chainer.Variable(xp.ones((), array.dtype))
    u = source.numbers("uniform", array.shape, array, True, "F.gumbel_softmax")
    g = (-xp.log(-xp.log(1.0 - u))).astype(array.dtype)
    return chainer.functions.softmax((log_pi + g) / tau, axis=axis)


def walker_sample(source: Source, sampler: Any, shape: Any) -> Any:
    """chainer's ``WalkerAlias.sample`` with its uniforms drawn by ``source``."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    xp = chainer.backend.get_array_module(sampler.threshold)
    with chainer.using_device(sampler.device):
        like = xp.empty((0,))
        u = source.numbers("uniform", shape, like if xp is not np else None, True,
                           "WalkerAlias.sample (NegativeSampling, BlackOut)")
        pb = u * len(sampler.threshold)
        index = pb.astype(np.int32)
        thr = sampler.threshold.dtype
        right = (sampler.threshold[index] < (pb.astype(thr) - index.astype(thr))).astype(np.int32)
        return sampler.values[index * 2 + right]


class Swap(NamedTuple):
    """A chainer callable replaced while a scope is active: (owner, name, maker)."""

    owner: Any
    name: str
    make: Callable[[Source], Any]


def _method(source: Source) -> Any:
    def sample(self: Any, shape: Any) -> Any:
        return walker_sample(source, self, shape)
    return sample


SWAPS: List[Swap] = [
    Swap(chainer.functions, "gumbel_softmax", lambda s: functools.partial(gumbel_softmax, s)),
    Swap(_gumbel_module, "gumbel_softmax", lambda s: functools.partial(gumbel_softmax, s)),
    Swap(walker_alias.WalkerAlias, "sample", _method),
]


class Swapped:
    """The swaps, done on entry and undone on exit."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.saved: List[Tuple[Any, str, Any]] = []

    def __enter__(self) -> "Swapped":
        for swap in SWAPS:
            self.saved.append((swap.owner, swap.name, swap.owner.__dict__[swap.name]))
            setattr(swap.owner, swap.name, swap.make(self.source))
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, value in reversed(self.saved):
            setattr(owner, name, value)
        self.saved = []


def describe(node: Any) -> Optional[str]:
    """The name of a node that draws, for errors; None for the others."""
    row = NODES.get(type(node))
    return row.what if row is not None else None
