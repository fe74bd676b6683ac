"""PipelineUpdater and PipelineEvaluator: chainer's updater and evaluator, pipelined.

Both replace only the step in the middle: where chainer's would call the
model on the whole mini-batch, they run it through a ``Runner``. Iterators,
converters, optimizers, reporters and every trainer extension are chainer's
own, so a Trainer runs them unchanged.
"""
import copy
from typing import Any, List

import chainer
from chainer import reporter as reporter_module
from chainer.dataset import concat_examples
from chainer.training import StandardUpdater
from chainer.training.extensions import Evaluator

from ..communicators import Communicator
from ..communicators._facade import note_progress
from ._batch_norm import defer_batch_norm
from ._runner import Runner
from ._schedule import TRAINING_SCHEDULES, Memory
from ._statistics import Event, Statistics
from ._trace import save_chrome_trace


class PipelineUpdater(StandardUpdater):
    """A ``StandardUpdater`` that pipelines each mini-batch in micro-batches.

    Every rank creates it (collective). The model is ``optimizer.target``:
    a MultiNodeChainList, with a ``chainer.links.Classifier`` around it on the
    rank that computes the loss; ranks without input iterate over
    ``mnpar.datasets.create_empty_dataset``. One update equals the update of
    the whole mini-batch without pipelining; ``main/loss`` and
    ``main/accuracy`` are the mini-batch means.

    Args:
        iterator: the training iterator (same batch size on every rank).
        optimizer: the optimizer of this rank's model.
        comm: the mnpar communicator the model was built with.
        n_microbatches: micro-batches per mini-batch (1 to the batch size).
        schedule: ``'1f1b'`` (live activations per rank bounded by the
            number of stages), ``'gpipe'`` (all forwards, then all backwards),
            ``'zb1'`` (zero bubble: each backward split into B, the input
            gradient, and W, the weight gradient, which fills idle time; at
            most as many live activations as 1f1b's first rank) or ``'zb2'``
            (the same with about twice the activations in flight).
        converter: chainer's converter, applied to the whole mini-batch.
        device: as for ``StandardUpdater``.
        checkpoint: activation recomputation, as in torchgpipe: ``'never'``,
            ``'except_last'`` (every micro-batch but the last) or ``'always'``.
        trace: record each action's start and end (``timeline``,
            ``save_timeline``).
        measure: count the segments of activations this rank keeps, and
            their bytes, after every action (``statistics``; slows a step).
        deferred_batchnorm: turn every ``chainer.links.BatchNormalization``
            of the model into a ``DeferredBatchNormalization``
            (``defer_batch_norm``), so running statistics move once per
            update, from the whole mini-batch, not once per micro-batch.
        memory: the most segments of activations (one component's, for one
            micro-batch) a rank keeps at once: an int for every rank, or
            rank -> int (``mnpar.pipeline.plan``).

    Raises:
        ValueError: a bad ``n_microbatches``, ``schedule`` or ``checkpoint``, a
            wiring that cannot be scheduled (``mnpar.WiringError``), or ranks
            whose ``schedule``, ``n_microbatches`` or stages (``build_stage``'s
            arguments) differ, on every rank; at the first update, on every
            rank, data that does not fit the stages (the rank that computes
            the loss iterates the labels, last; a rank without input
            components iterates none: ``create_empty_dataset``).

    Example::

        updater = mnpar.pipeline.PipelineUpdater(
            train_iter, optimizer, comm, n_microbatches=8, schedule="1f1b")
        trainer = chainer.training.Trainer(updater, (10, "epoch"))
    """

    def __init__(self, iterator: Any, optimizer: Any, comm: Communicator, n_microbatches: int,
                 schedule: str = "1f1b", converter: Any = concat_examples, device: Any = None,
                 checkpoint: str = "never", trace: bool = False,
                 deferred_batchnorm: bool = False, measure: bool = False,
                 memory: Memory = None, **kwargs: Any) -> None:
        super().__init__(iterator, optimizer, converter=converter, device=device, **kwargs)
        if deferred_batchnorm:
            defer_batch_norm(optimizer.target)
        self.runner = Runner(optimizer.target, comm, n_microbatches, schedule, checkpoint,
                             TRAINING_SCHEDULES, "PipelineUpdater", memory)
        self._trace, self._measure = trace, measure
        self.statistics = Statistics(0.0, 0.0)  # the last update's, this rank's

    @property
    def timeline(self) -> List[Event]:
        """The actions of the last update as they ran (with ``trace=True``)."""
        return list(self.statistics.events)

    def save_timeline(self, path: str) -> None:
        """Writes the last update's actions on every rank as a Chrome trace; collective."""
        save_chrome_trace(self.runner.comm, self.timeline, path)

    def update_core(self) -> None:
        note_progress("iteration {} of its PipelineUpdater", self.iteration + 1)
        iterator = self._iterators["main"]
        batch = iterator.next()
        optimizer = self._optimizers["main"]
        optimizer.target.cleargrads()
        self.statistics = self.runner.step(batch, self.converter, self.input_device,
                                           trace=self._trace, measure=self._measure)
        optimizer.update()
        if self.auto_new_epoch and iterator.is_new_epoch:
            optimizer.new_epoch(auto=True)

    def finalize(self) -> None:
        super().finalize()
        self.runner.free()


class PipelineEvaluator(Evaluator):
    """chainer's ``Evaluator``, running each batch forward-only through the pipeline.

    Every rank creates it and every rank's trainer extends it (collective).
    A batch smaller than ``n_microbatches`` (the last one) runs in as many
    micro-batches as it has examples.

    Args:
        iterator: the validation iterator (``repeat=False``).
        target: this rank's model, as for ``PipelineUpdater``.
        comm: the mnpar communicator.
        n_microbatches: micro-batches per batch.
        converter: chainer's converter.
        device: as for ``Evaluator``.

    Example::

        trainer.extend(mnpar.pipeline.PipelineEvaluator(test_iter, model, comm, 8))
    """

    def __init__(self, iterator: Any, target: Any, comm: Communicator, n_microbatches: int = 1,
                 converter: Any = concat_examples, device: Any = None, **kwargs: Any) -> None:
        super().__init__(iterator, target, converter=converter, device=device, **kwargs)
        self.runner = Runner(target, comm, n_microbatches, "forward", op="PipelineEvaluator")

    def evaluate(self) -> dict:
        iterator = self._iterators["main"]
        if self.eval_hook:
            self.eval_hook(self)
        if hasattr(iterator, "reset"):
            iterator.reset()
            it = iterator
        else:
            it = copy.copy(iterator)
        summary = reporter_module.DictSummary()
        for batch in it:
            observation: dict = {}
            with reporter_module.report_scope(observation), chainer.no_backprop_mode():
                self.runner.step(batch, self.converter, self.device,
                                 min(self.runner.n_microbatches, len(batch)))
            summary.add(observation)
        return summary.compute_mean()

    def finalize(self) -> None:
        super().finalize()
        self.runner.free()
