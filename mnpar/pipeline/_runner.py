"""One rank's pipeline: the joined wiring, the proven schedule, the executor.

Every rank builds it at once (it exchanges the wirings, a collective), so a
model whose wiring cannot be scheduled, or ranks whose schedule, micro-batch
count or stages differ, fail on every rank with the same message, before
anything is sent; the first step checks every rank's data against its stage
(``_agreement``). Each mini-batch is converted once, cut
into micro-batches along the first axis (sizes differ by at most one), and
run by the schedule.
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import chainer
from chainer.dataset import convert

from ..communicators import Communicator
from ..links import MultiNodeChainList
from ._agreement import Needs, check_agree, check_layout, input_arity, joint_arity
from ._batch_norm import commit_deferred
from ._executor import Executor, Head
from ._graph import Graph
from ._microbatch import Microbatches
from ._rules import rule_of
from ._schedule import SCHEDULES, Memory, Plan, check_schedule, component_costs, plan
from ._statistics import Statistics
from ._transfer import Transfer

CHECKPOINTS = ("never", "except_last", "always")


def microbatch_sizes(batch: int, n_microbatches: int) -> List[int]:
    """Sizes of the micro-batches: ``batch`` cut in ``n_microbatches`` near-equal parts.

    Raises:
        ValueError: ``n_microbatches`` is below 1 or above ``batch``.
    """
    check_microbatches(n_microbatches)
    if n_microbatches > batch:
        raise ValueError(f"n_microbatches={n_microbatches} is larger than the mini-batch of "
                         f"{batch} examples; use at most {batch} micro-batches or a larger "
                         "batch size")
    base, extra = divmod(batch, n_microbatches)
    return [base + (1 if i < extra else 0) for i in range(n_microbatches)]


def check_microbatches(n_microbatches: Any) -> int:
    """``n_microbatches`` if it is an int of at least 1, else a clear error."""
    if not isinstance(n_microbatches, int) or isinstance(n_microbatches, bool):
        raise TypeError(f"n_microbatches must be an int, not {type(n_microbatches).__name__} "
                        f"{n_microbatches!r}")
    if n_microbatches < 1:
        raise ValueError(f"n_microbatches={n_microbatches} must be at least 1")
    return n_microbatches


def parameter_counts(chain: MultiNodeChainList) -> List[Optional[int]]:
    """Each component's parameter count; None while one of its parameters is uninitialized."""
    counts: List[Optional[int]] = []
    for child in chain.children():
        params = list(child.params())
        counts.append(None if any(p.data is None for p in params)
                      else sum(p.size for p in params))
    return counts


def split_target(target: Any) -> Tuple[MultiNodeChainList, Optional[Any]]:
    """The MultiNodeChainList of ``target`` and the Classifier around it (or None)."""
    classifier = None
    chain = target
    if isinstance(target, chainer.links.Classifier):
        classifier, chain = target, target.predictor
    if not isinstance(chain, MultiNodeChainList):
        raise TypeError(f"the pipeline needs a MultiNodeChainList, or a "
                        f"chainer.links.Classifier around one; got {type(chain).__name__}")
    return chain, classifier


class Runner:
    """Runs mini-batches of one rank's model through a pipeline schedule; collective.

    Args:
        target: the rank's model (a MultiNodeChainList, with a Classifier
            around it on the rank that computes the loss).
        comm: the mnpar communicator the model was built with.
        n_microbatches: micro-batches per mini-batch.
        schedule: one of ``schedules``: ``'gpipe'``, ``'1f1b'``, ... or ``'forward'``.
        checkpoint: ``'never'``, ``'except_last'`` or ``'always'``.
        op: how errors name the runner's owner.
        memory: the most segments of activations a rank keeps (``plan``); the
            same on every rank, or the ranks' plans would differ.
    """

    def __init__(self, target: Any, comm: Communicator, n_microbatches: int, schedule: str,
                 checkpoint: str = "never", schedules: Tuple[str, ...] = SCHEDULES,
                 op: str = "the pipeline", memory: Memory = None) -> None:
        chain, classifier = split_target(target)
        inputs = [input_arity(c) for c, (rank_in, _) in zip(chain.children(), chain.wiring)
                  if rank_in is None]
        # One allgather: what the schedule needs, and what every rank must agree on.
        gathered = comm.allgather_obj((
            chain.wiring, classifier is not None, parameter_counts(chain),
            joint_arity(inputs),
            {"schedule": schedule, "n_microbatches": n_microbatches, "memory": memory,
             "stages (build_stage's balance, chunks, loop, model)":
                 getattr(chain, "_mnpar_stage", None)}))
        check_agree(op, [view for *_, view in gathered],
                    "Every rank must pass the same schedule, n_microbatches and memory, and "
                    "its stage of the same build_stage call")
        self.n_microbatches = check_microbatches(n_microbatches)
        check_schedule(schedule, schedules)
        if checkpoint not in CHECKPOINTS:
            raise ValueError(f"checkpoint={checkpoint!r} is not one of {CHECKPOINTS}")
        self.kind = schedule
        self.checkpoint = checkpoint
        self.memory = memory
        self.classifier = classifier
        self.rank = comm.rank
        self.comm = comm
        self.chain = chain
        self.op = op
        wirings = [(w, has_head, counts) for w, has_head, counts, _, _ in gathered]
        self.graph = Graph({r: w for r, (w, _, _) in enumerate(wirings)})
        self._set_costs([counts for _, _, counts in wirings])
        # What each rank's stage takes from its own data, checked at the first step.
        self._needs: Optional[List[Needs]] = [
            Needs(any(rank_in is None for rank_in, _ in w), arity, has_head)
            for w, has_head, _, arity, _ in gathered]
        for r, (w, has_head, _) in enumerate(wirings):
            has_output = any(out is None for _, out in w)
            if has_output != has_head:
                raise ValueError(
                    f"rank {r} {'has' if has_output else 'has no'} component with "
                    f"rank_out=None (the model's output) but "
                    f"{'is' if has_head else 'is not'} wrapped in a chainer.links.Classifier;"
                    " the rank that computes the loss needs both")
        self.plan(self.n_microbatches)
        head = None
        if classifier is not None:
            head = Head(classifier.lossfun,
                        classifier.accfun if classifier.compute_accuracy else None)
        self.transfer = Transfer(comm)
        self.executor = Executor(self.graph, self.rank, list(chain.children()), self.transfer,
                                 head)

    def _set_costs(self, counts: Sequence[Sequence[Optional[int]]]) -> None:
        """Schedules from now on weigh each component by its parameter count (every rank's)."""
        sizes = {(r, c): n or 0 for r, ranks in enumerate(counts) for c, n in enumerate(ranks)}
        self._costs = component_costs(self.graph, sizes)
        # A lazily initialized layer has no size before its first forward: count again then.
        self._recount = any(n is None for ranks in counts for n in ranks)
        self._plans: Dict[int, Plan] = {}

    def plan(self, n_microbatches: int) -> Plan:
        """Every rank's proven schedule for ``n_microbatches`` (computed once)."""
        if n_microbatches not in self._plans:
            self._plans[n_microbatches] = plan(self.graph, n_microbatches, self.kind,
                                               self._costs, self.memory)
        return self._plans[n_microbatches]

    def step(self, batch: Sequence[Any], converter: Any, device: Any,
             n_microbatches: Optional[int] = None, trace: bool = False,
             measure: bool = False) -> Statistics:
        """Runs one mini-batch and reports ``loss`` and ``accuracy`` on the loss rank;
        returns this rank's ``Statistics`` (``trace``, ``measure``: what they record)."""
        k = self.n_microbatches if n_microbatches is None else n_microbatches
        sizes = microbatch_sizes(len(batch), k)
        arrays = convert._call_converter(converter, batch, device)
        if self._needs is not None:  # the first step: every rank's data fits its stage
            check_layout(self.comm, self.op, self._needs, len(batch),
                         arrays if isinstance(arrays, (tuple, dict)) else (arrays,))
            self._needs = None
        if isinstance(arrays, dict):
            raise TypeError("the pipeline needs a converter that returns arrays or a tuple "
                            "of arrays, not a dict")
        arrays = arrays if isinstance(arrays, tuple) else (arrays,)
        labels: Any = None
        if self.classifier is not None:
            key = self.classifier.label_key
            if not isinstance(key, int):
                raise TypeError(f"the pipeline needs a Classifier with an int label_key, "
                                f"not {key!r}")
            labels = arrays[key]
            arrays = tuple(a for i, a in enumerate(arrays) if i != key % len(arrays))
        starts = [sum(sizes[:i]) for i in range(k + 1)]
        inputs = [tuple(a[starts[i]:starts[i + 1]] for a in arrays) for i in range(k)]
        cut_labels = ([labels[starts[i]:starts[i + 1]] for i in range(k)]
                      if labels is not None else [])
        weights = [s / len(batch) for s in sizes]
        train = rule_of(self.kind).trains
        last = k - 1
        recompute = {
            "never": lambda i: False,
            "except_last": lambda i: i < last,
            "always": lambda i: True,
        }[self.checkpoint]
        self.transfer.open()
        stats = self.executor.run(self.plan(k), Microbatches(inputs, cut_labels, weights, train,
                                                             recompute, sizes), trace, measure)
        if train:
            commit_deferred(self.chain)  # running statistics move once per mini-batch
        if self._recount:  # every rank knows it: the counts went round together
            self._set_costs(self.comm.allgather_obj(parameter_counts(self.chain)))
            self._recount = False
        if self.classifier is not None:
            observation = {"loss": stats.loss}
            if self.classifier.compute_accuracy:
                observation["accuracy"] = stats.accuracy
            chainer.report(observation, self.classifier)
        return stats

    def free(self) -> None:
        """Frees the pipeline's communicator (the next step makes a new one); collective."""
        self.transfer.free()
