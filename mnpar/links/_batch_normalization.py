"""MultiNodeBatchNormalization: chainer's BatchNormalization link over the global batch.

The link keeps chainer's attributes and persistent values (``avg_mean``,
``avg_var``, ``N``, ``gamma``, ``beta``), so a model's snapshots and its
``copyparams`` work as with chainer's; only training mode talks to the other
ranks (``_global_batch_norm``). Test mode normalizes with the running
averages, locally.
"""
import copy
import numbers
from typing import Any, Optional, Tuple, Union

import chainer
import chainer.functions as F
import numpy as np

from .._arrays import device_of
from ..communicators._facade import Communicator, require_communicator
from ..functions._global_batch_norm import check_backend, normalize_batch


def check_size(size: Any) -> Tuple[int, ...]:
    """``size`` as a shape of positive ints; ``TypeError``/``ValueError`` otherwise."""
    dims = size if isinstance(size, tuple) else (size,)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise TypeError(f"size={size!r} must be a positive int or a tuple of them "
                            f"(the channels), not {type(d).__name__}")
        if d < 1:
            raise ValueError(f"size={size!r} must be a positive int or a tuple of them "
                             "(the channels)")
    return tuple(int(d) for d in dims)


def _initializer(value: Any, default: float, dtype: np.dtype) -> chainer.Initializer:
    """``value`` (None: ``default``) as an initializer that fills arrays of ``dtype``."""
    if value is None:
        value = default
    if isinstance(value, chainer.Initializer):
        value = copy.copy(value)  # the caller's initializer keeps its own dtype
        value.dtype = dtype
        return value
    return chainer.initializers.Constant(value, dtype=dtype)


class MultiNodeBatchNormalization(chainer.Link):
    """Batch normalization with the mean and variance of the whole global batch.

    chainer's ``BatchNormalization`` normalizes each rank's batch by its own
    statistics, which are noisy when the batch per rank is small. This link
    sums every rank's count, ``Σx`` and ``Σx²`` in one allreduce, so each
    rank normalizes by the statistics of all ranks' examples together, and
    backward sums the gradient terms in one more. Outputs, gradients with
    respect to the inputs, and running averages equal those of chainer's
    ``BatchNormalization`` on the concatenated batch, also where ranks hold
    different numbers of examples. The gradients of ``gamma`` and ``beta``
    are the mean over ranks of each rank's, the same on every rank.

    Every rank must call the link in training mode together. With
    ``chainer.config.train`` False it uses ``avg_mean`` and ``avg_var`` and
    does not communicate. ``avg_var`` starts at 1, as in chainer's link
    (ChainerMN's started at 0).

    Args:
        size (int or tuple of ints): the shape of the channel axes (axis 1 on).
        comm: an mnpar communicator to share the statistics over.
        decay (float): decay rate of the running averages.
        eps (float): added to the variance, for numerical stability.
        dtype: dtype of ``gamma``, ``beta`` and the running averages
            (default chainer's; ``mixed16`` gives float32).
        use_gamma (bool): learn a scale ``gamma`` (else 1).
        use_beta (bool): learn a shift ``beta`` (else 0).
        initial_gamma: initializer or value of ``gamma`` (default 1).
        initial_beta: initializer or value of ``beta`` (default 0).
        communication_backend (str): ``'mpi'``: the communicator's allreduce;
            ``'nccl'``: NCCL on the GPU, for a ``pure_nccl`` communicator;
            ``'auto'``: NCCL where the communicator is ``pure_nccl`` and the
            arrays are on a GPU, else MPI.

    Raises:
        TypeError: ``comm`` is not an mnpar communicator, or ``size`` is not ints.
        ValueError: ``size`` is not positive, an unknown
            ``communication_backend``, or ``'nccl'`` without ``pure_nccl``.

    Example::

        comm = mnpar.create_communicator()
        bn = mnpar.links.MultiNodeBatchNormalization(64, comm)
        y = bn(x)            # x: this rank's (batch, 64, ...) examples
    """

    def __init__(self, size: Union[int, Tuple[int, ...]], comm: Communicator, decay: float = 0.9,
                 eps: float = 2e-5, dtype: Any = None, use_gamma: bool = True,
                 use_beta: bool = True, initial_gamma: Any = None, initial_beta: Any = None,
                 communication_backend: str = "auto") -> None:
        require_communicator(comm, "MultiNodeBatchNormalization")
        shape = check_size(size)
        self._communication_backend = check_backend(comm, communication_backend)
        super().__init__()
        self.comm = comm
        self._highprec_dtype = chainer.get_dtype(dtype, map_mixed16=np.float32)
        self.avg_mean = np.zeros(shape, self._highprec_dtype)
        self.register_persistent("avg_mean")
        self.avg_var = np.ones(shape, self._highprec_dtype)
        self.register_persistent("avg_var")
        self.N = 0
        self.register_persistent("N")
        self.decay = decay
        self.eps = eps
        with self.init_scope():
            if use_gamma:
                self.gamma = chainer.Parameter(
                    _initializer(initial_gamma, 1, self._highprec_dtype), shape)
            if use_beta:
                self.beta = chainer.Parameter(
                    _initializer(initial_beta, 0, self._highprec_dtype), shape)

    def _constant(self, name: str, fill: float) -> Any:
        """Parameter ``name``, or a constant of ``fill`` where the link does not learn it."""
        param: Optional[chainer.Parameter] = getattr(self, name, None)
        if param is not None:
            return param
        with device_of(self.avg_mean):
            return self.xp.full(self.avg_mean.shape, fill, self._highprec_dtype)

    def forward(self, x: Any, finetune: bool = False) -> chainer.Variable:
        """Normalizes ``x``; collective over the communicator in training mode.

        Args:
            x: this rank's batch, ``(batch, *size, ...)``.
            finetune (bool): in training mode, accumulate population statistics
                (``avg_mean`` and ``avg_var`` become the mean over calls since
                ``start_finetuning``) instead of decaying averages.
        """
        gamma, beta = self._constant("gamma", 1), self._constant("beta", 0)
        if not chainer.config.train:
            return F.fixed_batch_normalization(x, gamma, beta, self.avg_mean, self.avg_var,
                                               self.eps)
        return normalize_batch(self, x, gamma, beta, finetune, self.comm,
                               self._communication_backend)

    def start_finetuning(self) -> None:
        """Resets the count of fine-tuning calls; call it before fine-tuning again."""
        self.N = 0

    def __deepcopy__(self, memo: dict) -> "MultiNodeBatchNormalization":
        """A copy with its own arrays that shares the communicator (which cannot be copied)."""
        memo[id(self.comm)] = self.comm
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            new.__dict__[name] = copy.deepcopy(value, memo)
        return new
