"""A recomputed forward on a GPU draws what its first run drew, without a scope.

A pipeline segment with activation recomputation runs its forward twice:
once without a graph, its outputs sent on, and again just before its
backward. On a CPU the pipeline saves NumPy's global random state before the
first run and sets it again for the second, so every draw repeats. On a GPU
chainer's random functions draw from cupy's generator, and dropout on
contiguous arrays from cuDNN's own states, neither of which can be saved.
Inside ``replay(seed)``:

    cupy's global generator    a RandomState(seed), the same in both runs, then
                               the one from before is put back
    F.dropout on a GPU array   its mask drawn from that generator, as chainer's
                               non-cuDNN path draws it (not from cuDNN's states)
    cuDNN's RNN with dropout   refused: its states cannot be replayed

so the second run draws the first run's numbers. The seed is drawn from
cupy's global generator when the segment first runs (``new_seed``), so
``cupy.random.seed`` fixes it. Inside a ``scope`` the scope's draws repeat by
construction, and ``replay`` does nothing.
"""
import contextlib
from typing import Any, Iterator, Optional, Sequence

import chainer
import numpy as np
from chainer.functions.noise.dropout import Dropout

from .._arrays import cupy_module, is_cupy_array
from ._draws import is_cudnn_rnn
from ._places import rnn_dropout
from ._scope import active


def new_seed(link: chainer.Link, inputs: Sequence[Any]) -> Optional[int]:
    """A seed for the replay of a segment of ``link`` on a GPU; None on a CPU."""
    cupy = cupy_module()
    on_gpu = any(is_cupy_array(x.array if isinstance(x, chainer.Variable) else x)
                 for x in inputs) or any(is_cupy_array(p.array) for p in link.params())
    if cupy is None or not on_gpu:
        return None
    return int(cupy.random.randint(0, 2 ** 31 - 1))


class _GpuDropout(chainer.FunctionHook):
    """Dropout on a GPU array takes its mask from cupy's generator; cuDNN's RNN dropout is
    refused."""

    name = "mnpar.random.replay"

    def forward_preprocess(self, function: Any, in_data: Any) -> None:
        if type(function) is Dropout and function.mask is None and is_cupy_array(in_data[0]):
            x = in_data[0]
            cupy = cupy_module()
            flag = cupy.random.rand(*x.shape, dtype=np.float32) >= function.dropout_ratio
            function.mask = x.dtype.type(1.0 / (1.0 - function.dropout_ratio)) * flag
        elif is_cudnn_rnn(function) \
                and chainer.config.train and rnn_dropout() != 0:
            raise ValueError(
                "pipeline recomputation: cuDNN's RNN draws its dropout from cuDNN's own "
                "states, which a recomputed forward cannot draw again; use "
                "checkpoint='never', or chainer.using_config('use_cudnn', 'never')")


@contextlib.contextmanager
def replay(seed: int) -> Iterator[None]:
    """Within it, cupy's draws (and dropout's on GPU arrays) are those of ``seed``."""
    cupy = cupy_module()
    if active() or cupy is None:
        yield
        return
    saved = cupy.random.get_random_state()
    cupy.random.set_random_state(cupy.random.RandomState(seed))
    try:
        with _GpuDropout():
            yield
    finally:
        cupy.random.set_random_state(saved)
