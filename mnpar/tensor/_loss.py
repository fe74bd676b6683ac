"""Softmax cross-entropy and accuracy over logits cut by vocabulary, never joined.

An output layer split by columns gives each rank the logits of its part of
the vocabulary. Joining them would put the whole ``(tokens, vocabulary)``
array on every rank, the very array the split was for. Instead each rank
reduces its part and the group exchanges one number per token::

    m   = max over the vocabulary      each rank's max, then allreduce (max)   N floats
    s   = sum of exp(x - m)            each rank's sum      ┐ one allreduce
    x_t = the label's logit            the rank that holds  ┘ (sum) of 2N floats
                                       it, 0 elsewhere
    loss = -(x_t - m - log s), averaged as chainer's softmax_cross_entropy does

Backward needs no message: each rank's gradient of its logits is
``softmax - onehot`` on its own columns (``exp(x - m) / s``). Accuracy takes
each rank's best logit and its index (one allgather of 2N numbers) and keeps
the first best, as ``argmax`` over the whole vocabulary would.
"""
import types
from typing import Any

import chainer
import numpy as np

from .._arrays import get_array_module
from ..functions import _group_ops as ops
from ..functions._conjugate import notify
from ._errors import Refusal


def check_labels(t: Any, total: int, ignore_label: Any, what: str) -> None:
    """Labels outside the vocabulary would count as nobody's: refused on every rank
    (``t`` is the same on every rank)."""
    if t.dtype.kind not in "iu":
        raise Refusal(f"its labels are {t.dtype} (soft targets)", "give integer labels")
    valid = t[t != ignore_label] if ignore_label is not None else t.ravel()
    if valid.size and (int(valid.min()) < 0 or int(valid.max()) >= total):
        bad = int(valid.min()) if int(valid.min()) < 0 else int(valid.max())
        raise Refusal(f"label {bad} is outside the vocabulary of {total} classes{what}",
                      "give labels in [0, vocabulary) or the ignore_label")


class VocabCrossEntropy(chainer.FunctionNode):
    """``softmax_cross_entropy`` of logits cut along axis 1 over the group."""

    def __init__(self, comm: Any, bounds: Any, normalize: bool, ignore_label: int,
                 reduce: str) -> None:
        self.comm = comm
        self.bounds = bounds
        self.normalize = normalize
        self.ignore_label = ignore_label
        self.reduce = reduce

    def _local(self, x: Any, t: Any) -> Any:
        xp = get_array_module(x)
        start, stop = self.bounds[self.comm.rank], self.bounds[self.comm.rank + 1]
        valid = t != self.ignore_label
        inside = valid & (t >= start) & (t < stop)
        return xp, valid, inside, xp.where(inside, t - start, 0)

    def forward(self, inputs):
        self.retain_inputs((0, 1))
        x, t = inputs
        xp, valid, inside, local = self._local(x, t)
        xl = xp.moveaxis(x, 1, -1)
        notify(self, self.comm, "allreduce", "forward")
        m = ops.max_of(self.comm, xl.max(axis=-1), "tensor-parallel softmax_cross_entropy")
        s = xp.exp(xl - m[..., None]).sum(axis=-1)
        xt = xp.take_along_axis(xl, local[..., None], -1)[..., 0] * inside
        notify(self, self.comm, "allreduce", "forward")
        s, xt = ops.sum_of(self.comm, xp.stack([s, xt]), "tensor-parallel "
                           "softmax_cross_entropy")
        self._m, self._s = m, s
        log_p = (xt - m - xp.log(s)) * valid
        if self.reduce == "mean":
            count = int(valid.sum()) if self.normalize else len(x)
            self._coeff = 1.0 / max(count, 1)
            return xp.asarray(-log_p.sum() * self._coeff, dtype=x.dtype),
        return (-log_p).astype(x.dtype, copy=False),

    def backward(self, indexes, grad_outputs):
        x, t = (v.array for v in self.get_retained_inputs())
        xp, valid, inside, local = self._local(x, t)
        p = xp.exp(xp.moveaxis(x, 1, -1) - self._m[..., None]) / self._s[..., None]
        onehot = xp.zeros_like(p)
        xp.put_along_axis(onehot, local[..., None], inside[..., None].astype(p.dtype), -1)
        gy = grad_outputs[0].array
        scale = gy * self._coeff if self.reduce == "mean" else gy[...]
        g = (p - onehot) * (valid * scale)[..., None]
        return chainer.Variable(xp.moveaxis(g, -1, 1).astype(x.dtype, copy=False)), None


def accuracy(comm: Any, bounds: Any, y: Any, t: Any, ignore_label: Any) -> Any:
    """chainer's ``accuracy`` of logits cut along axis 1 (an array, the same on every rank)."""
    notify(types.SimpleNamespace(), comm, "allgather", "forward")
    xp = get_array_module(y)
    yl = xp.moveaxis(y, 1, -1)
    best = yl.max(axis=-1).astype(np.float64)
    index = (yl.argmax(axis=-1) + bounds[comm.rank]).astype(np.float64)
    both, _ = ops.gather(comm, xp.stack([best, index])[None], 0, "tensor-parallel accuracy")
    rank = both[:, 0].argmax(axis=0)  # the first best: the lowest index among equals
    pred = xp.take_along_axis(both[:, 1], rank[None], 0)[0].astype(t.dtype).reshape(t.shape)
    if ignore_label is None:
        return xp.asarray((pred == t).mean(dtype=y.dtype))
    mask = t == ignore_label
    total = t.size - int(mask.sum())
    count = int(((pred == t) & ~mask).sum())
    return xp.asarray(count / total if total else 0.0, dtype=y.dtype)
