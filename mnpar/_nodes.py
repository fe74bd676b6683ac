"""Chainer's function nodes as the guards' tables name them, and the elementwise ones.

Spatial and tensor parallelism each judge every chainer function node that
meets a split array by a table keyed by the node's class under
``chainer.functions`` (``key``: ``"math.basic_math.Add"``), and name it in
their errors as the user calls it (``function_name``: ``"F.add (Add)"``).

``POINTWISE`` is what both tables have in common: the nodes that compute
each output element from the inputs' elements at the same index (numpy
broadcasting) and draw no random numbers, so they are exact on any split
of their inputs once the parts line up. Each package builds its own
pointwise set from it and says where it differs; a function added to
chainer's elementwise set is added here, once. ``RANDOM_POINTWISE`` are
the elementwise nodes that draw: each package says how it draws them.
"""
from typing import Any, Dict, FrozenSet, List

import chainer.functions as F

POINTWISE: FrozenSet[str] = frozenset("""
activation.clipped_relu.ClippedReLU activation.elu.ELU activation.hard_sigmoid.HardSigmoid
activation.leaky_relu.LeakyReLU activation.relu.ReLU activation.sigmoid.Sigmoid
activation.softplus.Softplus activation.tanh.Tanh
array.cast.Cast array.copy.Copy array.where.Where array.broadcast.Broadcast
loss.absolute_error.AbsoluteError loss.squared_error.SquaredError
math.arctanh.Arctanh math.basic_math.Absolute math.basic_math.Add
math.basic_math.AddConstant math.basic_math.Div math.basic_math.DivFromConstant
math.basic_math.Mul math.basic_math.MulConstant math.basic_math.MultiAdd math.basic_math.Neg
math.basic_math.PowConstVar math.basic_math.PowVarConst math.basic_math.PowVarVar
math.basic_math.Sub math.basic_math.SubFromConstant math.clip.Clip math.digamma.DiGamma
math.erf.Erf math.erfc.Erfc math.erfcinv.ErfcInv math.erfcx.Erfcx math.erfinv.ErfInv
math.exponential.Exp math.exponential.Log math.exponential.Log10 math.exponential.Log2
math.exponential_m1.Expm1 math.fmod.Fmod math.hyperbolic.Cosh math.hyperbolic.Sinh
math.identity.Identity math.lgamma.LGamma math.linear_interpolate.LinearInterpolate
math.log_ndtr.LogNdtr math.logarithm_1p.Log1p math.maximum.Maximum math.minimum.Minimum
math.ndtr.Ndtr math.ndtri.Ndtri math.polygamma.PolyGamma math.sqrt.RsqrtGPU math.sqrt.Sqrt
math.square.Square math.trigonometric.Arccos math.trigonometric.Arcsin
math.trigonometric.Arctan math.trigonometric.Arctan2 math.trigonometric.Cos
math.trigonometric.Sin math.trigonometric.Tan math.zeta.Zeta
""".split())

RANDOM_POINTWISE: FrozenSet[str] = frozenset("""
activation.rrelu.RReLU noise.dropout.Dropout noise.gaussian.Gaussian noise.zoneout.Zoneout
""".split())

_KEYS: Dict[type, str] = {}


def key(node: Any) -> str:
    """The node's class as ``package.module.Class`` under ``chainer.functions``."""
    cls = type(getattr(node, "_function", None) or node)
    name = _KEYS.get(cls)
    if name is None:  # a guard asks for every node it sees: once per class
        name = _KEYS[cls] = f"{cls.__module__}.{cls.__qualname__}".replace(
            "chainer.functions.", "", 1)
    return name


_PUBLIC: Dict[str, List[str]] = {}


def function_name(node: Any) -> str:
    """``F.name (Class)`` where the node's module defines one function of chainer.functions."""
    cls = type(getattr(node, "_function", None) or node)
    names = _public_names().get(cls.__module__, [])
    plain = cls.__name__.lower().replace("function", "")
    match = [n for n in names if n.replace("_", "") == plain] or names
    return f"F.{match[0]} ({cls.__name__})" if len(match) == 1 else cls.__name__


def _public_names() -> Dict[str, List[str]]:
    """The public functions of ``chainer.functions`` by the module that defines them."""
    if not _PUBLIC:
        for name in dir(F):
            fn = getattr(F, name)
            if callable(fn) and not name.startswith("_") and hasattr(fn, "__module__"):
                _PUBLIC.setdefault(fn.__module__, []).append(name)
    return _PUBLIC
