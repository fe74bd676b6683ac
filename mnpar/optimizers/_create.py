"""``create_multi_node_optimizer``: picks the wrapper, so neither wrapper imports the other."""

import chainer

from ..communicators._facade import Communicator
from ._double_buffering import DoubleBufferingOptimizer
from ._multi_node import MultiNodeOptimizer
from ._sharded import STAGES, ShardedOptimizer


def create_multi_node_optimizer(actual_optimizer: chainer.Optimizer, communicator: Communicator,
                                double_buffering: bool = False,
                                zero_fill: bool = True, stage: int = 0,
                                reshard_after_forward: bool = True) -> MultiNodeOptimizer:
    """Wraps a Chainer optimizer for data-parallel training.

    Args:
        actual_optimizer: a Chainer optimizer, e.g. ``chainer.optimizers.Adam()``.
        communicator: an mnpar communicator over the data-parallel ranks; its
            strategy (``naive``, ``flat``, ``hierarchical``, ``pure_nccl``)
            averages the gradients.
        double_buffering: overlap the gradient allreduce with the next step's
            forward and backward; each update then applies the gradients of
            the step before (one step stale). Works with every communicator.
        zero_fill: a gradient that is None (a parameter unused this step) takes
            part as zeros; if False such parameters are skipped, which every
            rank must then agree on.

    Returns:
        MultiNodeOptimizer: the wrapper; its ``setup(link)`` returns it too.

    Raises:
        TypeError: ``actual_optimizer`` is not a ``chainer.Optimizer``, or
            ``communicator`` has no ``multi_node_mean_grad``.

    Example::

        comm = mnpar.create_communicator("hierarchical")
        optimizer = mnpar.create_multi_node_optimizer(
            chainer.optimizers.Adam(), comm).setup(model)
    """
    if not isinstance(actual_optimizer, chainer.Optimizer):
        raise TypeError(f"actual_optimizer must be a chainer.Optimizer (e.g. "
                        f"chainer.optimizers.Adam()), not {type(actual_optimizer).__name__}")
    if not callable(getattr(communicator, "multi_node_mean_grad", None)):
        raise TypeError(f"communicator must be an mnpar communicator, not "
                        f"{type(communicator).__name__}")
    if isinstance(stage, bool) or stage not in (0,) + STAGES:
        raise ValueError(f"stage={stage!r} must be 0 (plain data parallelism), 1 (optimizer "
                         "state sharded), 2 (gradients too) or 3 (parameters too)")
    if stage:
        if double_buffering:
            raise ValueError(f"stage={stage} cannot be combined with double_buffering=True: a "
                             "sharded update needs this step's reduced gradients before it "
                             "updates the shards and gathers the parameters; use stage=0")
        if not zero_fill:
            raise ValueError(f"stage={stage} reduces every parameter's gradient (a missing "
                             "one as zeros); zero_fill=False is for stage 0 only")
        return ShardedOptimizer(actual_optimizer, communicator, stage, reshard_after_forward)
    if double_buffering:
        return DoubleBufferingOptimizer(actual_optimizer, communicator, zero_fill)
    return MultiNodeOptimizer(actual_optimizer, communicator, zero_fill)
