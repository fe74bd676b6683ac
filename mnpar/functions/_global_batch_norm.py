"""Batch normalization over the global batch: every rank's examples count once.

Forward and backward each make one packed allreduce of per-channel sums::

    forward    [count, Σx, Σx²]    -> the global batch's mean and variance
    backward   [Σgy, Σgy·x̂]       -> what every rank's gx needs

Sums travel, not means: a rank with more examples weighs more, so unequal
local batches give the statistics of their concatenation (a mean of
per-rank means would not). The sums are float64, and each rank computes
its own from values centred on its local mean, so the one cancellation
left, ``Σx²/n - mean²``, spends float64 digits rather than the input's:
float16 and float32 inputs keep their precision unless ``|mean|`` exceeds
about 10⁴ standard deviations.

The sums go through the communicator's ``allreduce`` (``'mpi'``), or on
the GPU through the NCCL group of a ``pure_nccl`` communicator (``'nccl'``);
``'auto'`` takes NCCL for GPU arrays on ``pure_nccl`` and MPI otherwise.
Gradients of gradients are not supported.
"""
from typing import Any, Tuple

import chainer
import numpy as np
from chainer.utils import type_check

from .._arrays import device_of, get_array_module, is_cupy_array
from ..communicators._facade import Communicator

BACKENDS = ("auto", "mpi", "nccl")


def check_backend(comm: Communicator, communication_backend: str) -> str:
    """``communication_backend`` itself, once it is known to work with ``comm``.

    Raises:
        ValueError: an unknown name, or ``'nccl'`` without a ``pure_nccl``
            communicator (which needs cupy, NCCL and a GPU per rank).
    """
    if communication_backend not in BACKENDS:
        raise ValueError(f"communication_backend={communication_backend!r} is not one of "
                         f"{BACKENDS}")
    if communication_backend == "nccl" and not comm.strategy.nccl:
        raise ValueError(f"communication_backend='nccl' needs a 'pure_nccl' communicator "
                         f"(cupy, NCCL and a GPU per rank), not {comm.name!r}; "
                         "use 'mpi' or 'auto'")
    return communication_backend


def _allreduce(comm: Communicator, backend: str, buf: Any) -> Any:
    """The sum over ranks of a packed float64 buffer.

    NCCL for GPU arrays where the backend allows it and the communicator is
    ``pure_nccl``; else the communicator's ``allreduce`` (so ``'auto'`` means
    MPI on CPUs).
    """
    gpu = is_cupy_array(buf)
    if backend == "nccl" and not gpu:
        raise TypeError("communication_backend='nccl' normalizes GPU arrays only; move "
                        "the model and its inputs to the GPU or use 'mpi'")
    if not gpu or backend == "mpi" or not comm.strategy.nccl:
        return comm.allreduce(buf)
    with device_of(buf):
        comm.nccl_sum(buf)
    return buf


def _axes(x_ndim: int, gamma_ndim: int) -> Tuple[Tuple[int, ...], tuple]:
    """The axes summed over (batch, and every axis after the channels) and the expander."""
    axis = (0,) + tuple(range(gamma_ndim + 1, x_ndim))
    expander = tuple(None if i in axis else slice(None) for i in range(x_ndim))
    return axis, expander


def _local_sums(x: Any, count: int, axis: tuple, expander: tuple,
                dtype: np.dtype) -> Tuple[Any, Any]:
    """``Σx`` and ``Σx²`` per channel in float64, from values centred on the local mean."""
    xp = get_array_module(x)
    centre = (x.sum(axis=axis, dtype=np.float64) / max(count, 1)).astype(dtype)
    d = x.astype(dtype, copy=False) - centre[expander]
    t1 = d.sum(axis=axis, dtype=np.float64)
    t2 = xp.square(d).sum(axis=axis, dtype=np.float64)
    c = centre.astype(np.float64)
    return count * c + t1, t2 + c * (2 * t1 + count * c)


def normalize_batch(link: Any, x: Any, gamma: Any, beta: Any, finetune: bool,
                    comm: Communicator, backend: str,
                    mean_param_grads: bool = True) -> chainer.Variable:
    """A batch-normalization link's training forward over ``comm``'s ranks.

    Decays the link's running averages (or, with ``finetune``, averages them
    over the calls counted in ``link.N``); a recomputed forward updates nothing.
    """
    decay = link.decay
    if finetune:
        link.N += 1
        decay = 1.0 - 1.0 / link.N
    mean, var = link.avg_mean, link.avg_var
    if chainer.config.in_recomputing:
        if finetune:
            link.N -= 1
        mean = var = None
    node = GlobalBatchNormalization(comm, backend, link.eps, mean, var, decay, mean_param_grads)
    return node.apply((x, gamma, beta))[0]


class GlobalBatchNormalization(chainer.FunctionNode):
    """``y = gamma * (x - mean) / sqrt(var + eps) + beta`` with the global batch's statistics.

    Updates ``running_mean`` and ``running_var`` in place (unless None) as
    chainer's batch normalization would on the concatenated batch.
    """

    def __init__(self, comm: Communicator, backend: str, eps: float, running_mean: Any,
                 running_var: Any, decay: float, mean_param_grads: bool = True) -> None:
        self.comm = comm
        self.mean_param_grads = mean_param_grads
        self.backend = backend
        self.eps = eps
        self.running_mean = running_mean
        self.running_var = running_var
        self.decay = decay

    def check_type_forward(self, in_types: Any) -> None:
        type_check.expect(in_types.size() == 3)
        x_type, gamma_type, beta_type = in_types
        type_check.expect(
            x_type.dtype.kind == "f",
            gamma_type.dtype.kind == "f",
            gamma_type.dtype == beta_type.dtype,
            gamma_type.shape == beta_type.shape,
            x_type.ndim > gamma_type.ndim,
        )
        for i in range(type_check.eval(gamma_type.ndim)):
            type_check.expect(x_type.shape[i + 1] == gamma_type.shape[i])

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        self.retain_inputs((0, 1))
        x, gamma, beta = inputs
        xp = get_array_module(x)
        self.axis, self.expander = _axes(x.ndim, gamma.ndim)
        dtype = np.promote_types(x.dtype, gamma.dtype)
        with device_of(x):
            count = x.size // gamma.size
            s1, s2 = _local_sums(x, count, self.axis, self.expander, dtype)
            packed = xp.concatenate([xp.full(1, count, np.float64), s1.ravel(), s2.ravel()])
            total = _allreduce(self.comm, self.backend, packed)
            c = gamma.size
            n = float(total[0])
            if n == 0:
                raise ValueError("MultiNodeBatchNormalization got an empty batch on every rank")
            mean64 = total[1:1 + c] / n
            var64 = xp.maximum(total[1 + c:] / n - mean64 * mean64, 0)
            self.n = n
            self.mean = mean64.reshape(gamma.shape).astype(dtype)
            var = var64.reshape(gamma.shape).astype(dtype)
            self.inv_std = (1 / xp.sqrt(var + self.eps)).astype(dtype)
            e = self.expander
            x_hat = (x - self.mean[e]) * self.inv_std[e]
            y = gamma.astype(dtype)[e] * x_hat + beta.astype(dtype)[e]
            if self.running_mean is not None:
                adjust = n / max(n - 1.0, 1.0)  # unbiased, with the global count
                self.running_mean *= self.decay
                self.running_mean += (1 - self.decay) * self.mean
                self.running_var *= self.decay
                self.running_var += (1 - self.decay) * adjust * var
        return y.astype(x.dtype, copy=False),

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, gamma = self.get_retained_inputs()
        return GlobalBatchNormalizationGrad(self).apply((x, gamma, grad_outputs[0]))


class GlobalBatchNormalizationGrad(chainer.FunctionNode):
    """``gx``, ``ggamma`` and ``gbeta`` of ``GlobalBatchNormalization``; one allreduce.

    ``ggamma`` and ``gbeta`` are the mean over ranks of each rank's sum, the
    same on every rank (as ChainerMN's): averaging them over ranks, as
    ``create_multi_node_optimizer`` does, leaves them as they are. With
    ``mean_param_grads=False`` they are the sum (spatial layers: the ranks hold
    parts of one image, and the whole image's gradient is the sum).
    """

    def __init__(self, bn: GlobalBatchNormalization) -> None:
        self.bn = bn

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        x, gamma, gy = inputs
        bn, xp = self.bn, get_array_module(x)
        e = bn.expander
        with device_of(x):
            x_hat = (x - bn.mean[e]) * bn.inv_std[e]
            sums = xp.concatenate([gy.sum(axis=bn.axis, dtype=np.float64).ravel(),
                                   (gy * x_hat).sum(axis=bn.axis, dtype=np.float64).ravel()])
            total = _allreduce(bn.comm, bn.backend, sums)
            gbeta = total[:gamma.size].reshape(gamma.shape).astype(x_hat.dtype)
            ggamma = total[gamma.size:].reshape(gamma.shape).astype(x_hat.dtype)
            gx = (gamma * bn.inv_std)[e] * (gy - (x_hat * ggamma[e] + gbeta[e]) / bn.n)
            size = bn.comm.size if bn.mean_param_grads else 1
        return (gx.astype(x.dtype, copy=False), (ggamma / size).astype(gamma.dtype),
                (gbeta / size).astype(gamma.dtype))

    def backward(self, indexes: Tuple[int, ...],
                 grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        raise NotImplementedError("MultiNodeBatchNormalization has no second-order gradients")
