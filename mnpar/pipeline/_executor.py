"""Runs one rank's actions, each as its own small graph segment.

A forward of component c on micro-batch k takes its inputs as fresh leaf
Variables (arrays received, or the outputs an earlier local component left
in the local queue), runs the component and keeps its outputs (a
``Segment``); the arrays go on at once, non-blocking. Its backward calls
``chainer.backward`` on the kept outputs with the output gradients
(received, or left by a local consumer) and passes the input leaves'
``.grad`` back to their producers. Parameters accumulate their gradients
over the micro-batches, weighted as ``_microbatch`` says. Where the plan
splits a component's backward, B computes the inputs' gradients only and W
the weights' later (``_split``; adjacent W actions of one component run as
one).

With activation recomputation a forward runs without a graph and keeps only
its input leaves (and NumPy's random state, and on a GPU a seed for cupy's,
so dropout and the other random functions draw the same masks: ``mnpar.random``'s
replay); its
backward runs the forward again, with the graph, first, under chainer's
``in_recomputing`` flag, so BatchNormalization and the other layers that
honour it update their running statistics once, not twice.

Every forward of micro-batch k runs inside ``mnpar.random``'s batch share
(its examples' place in the mini-batch), so under ``mnpar.random.scope``
its random functions draw the mini-batch's numbers for those examples.

A wait that fails (a timeout, a lost peer) names the action it was in and
this rank's row of the schedule around it. ``run`` returns the step's
``Statistics``.

Tags: ``(edge * K + k) * 2 + direction``, unique within a step.
"""
import contextlib
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import chainer
import numpy as np

from .._errors import CommunicationError
from ..communicators._facade import TUPLE, Message
from ..random import _position, _replay
from ._actions import Action
from ._graph import Edge, Graph
from ._microbatch import Head, Losses, Microbatches
from ._schedule import Plan
from ._segment import Segment, as_list, data_of, leaf, replaying
from ._split import Accumulator, SplitCheck, input_gradients, weight_gradients
from ._statistics import Meter, Statistics
from ._transfer import Transfer

__all__ = ["Executor", "Head"]

ROW_CONTEXT = 6  # actions shown on each side of the one a failed wait is in


class _Progress(chainer.FunctionHook):
    """Lets MPI move this rank's sends after every function node of an action.

    Without it a large activation sent before a long action reaches its
    receiver only when the action ends (MPI's rendezvous needs the sender).
    """

    name = "mnpar-pipeline-progress"

    def __init__(self, transfer: Transfer) -> None:
        self.transfer = transfer

    def forward_postprocess(self, function: Any, in_data: Any) -> None:
        self.transfer.progress()

    def backward_postprocess(self, function: Any, in_data: Any, out_grad: Any) -> None:
        self.transfer.progress()


class _Step:
    """The state of one step: segments kept, local queues, sums so far."""

    def __init__(self, batch: Microbatches, split: Set[int], meter: Meter) -> None:
        self.batch = batch
        self.split = split  # components whose W is its own action
        self.meter = meter
        self.segments: Dict[Tuple[int, int], Segment] = {}
        self.local: Dict[Tuple[int, int], Message] = {}
        self.local_grads: Dict[Tuple[int, int], List[Any]] = {}
        self.losses = Losses(batch)
        self.sums = Accumulator()  # parameter gradients W adds


class Executor:
    """Runs this rank's part of each step.

    Args:
        graph: the component graph of all ranks.
        rank: this rank.
        components: this rank's component links, in order.
        transfer: the pipeline's messages.
        head: the loss, on the rank whose component gives the model's output.
    """

    def __init__(self, graph: Graph, rank: int, components: Sequence[Any], transfer: Transfer,
                 head: Optional[Head]) -> None:
        self.graph = graph
        self.rank = rank
        self.components = list(components)
        self.transfer = transfer
        self.head = head
        self._splits = SplitCheck(rank)
        self._actions: Sequence[Action] = ()  # the step's, and the one running (_where)
        self._index = 0
        self._single = len(self.components) == 1
        self._label = ""

    def run(self, plan: Plan, batch: Microbatches, trace: bool = False,
            measure: bool = False) -> Statistics:
        """Runs this rank's actions of ``plan`` on ``batch``.

        Args:
            plan: every rank's proven schedule.
            batch: the mini-batch, cut in micro-batches.
            trace: record each action and each receive that waited.
            measure: count the live segments and their bytes after each action.

        Returns:
            The weighted loss and accuracy sums (0 without head), and what
            ``trace`` and ``measure`` asked for.
        """
        split = {c for r, c in plan.split if r == self.rank}
        self._step = _Step(batch, split, Meter(trace, measure))
        with _Progress(self.transfer):
            self._run(plan[self.rank])
        try:
            self.transfer.finish()
        except CommunicationError as e:
            raise type(e)(f"{e}; in the pipeline, at the end of the step (its sends "
                          "to be received)") from None
        step, self._step = self._step, None  # type: ignore[assignment]
        return step.meter.result(step.losses.loss, step.losses.accuracy)

    def _run(self, actions: Sequence[Action]) -> None:
        self._actions = actions
        meter = self._step.meter
        i = 0
        while i < len(actions):
            self._index = i
            action = actions[i]
            self._label = action.label(self._single)
            start = time.perf_counter()
            if action.weight:
                run = [action.microbatch]
                while (i + 1 < len(actions) and actions[i + 1].weight
                       and actions[i + 1].component == action.component):
                    i += 1
                    run.append(actions[i].microbatch)
                self._label += "".join(f"+{k}" for k in run[1:])
                self._weights(action.component, run)
            elif action.backward:
                self._backward(action.component, action.microbatch)
            else:
                self._forward(action.component, action.microbatch)
            meter.action(self._label, start, time.perf_counter())
            meter.segments(self._step.segments.values())
            i += 1

    def _forward(self, c: int, k: int) -> None:
        step = self._step
        batch = step.batch
        node = (self.rank, c)
        seg = Segment()
        if self.graph.takes_inputs(node):
            seg.args = tuple(batch.inputs[k])
        else:
            tuples = []
            for edge in self.graph.ins[node]:
                got = (step.local.pop((edge.id, k)) if edge.local
                       else self._recv(edge.src[0], self._tag(edge, k, 0)))
                seg.inputs.append([leaf(a) for a in got.arrays])
                tuples.append(got.is_tuple)
            seg.args = tuple(tuple(ls) if t else ls[0] for ls, t in zip(seg.inputs, tuples))
        keep = batch.train and not batch.recompute(k)
        if batch.train and not keep:
            seg.rng = np.random.get_state()
            seg.seed = _replay.new_seed(self.components[c], seg.args)
        with contextlib.nullcontext() if keep else chainer.no_backprop_mode():
            outputs = self._compute(c, k, seg)
        if keep:
            seg.outputs = outputs
        else:
            seg.loss = None  # recomputed with its graph in backward
        if batch.train:
            step.segments[(c, k)] = seg
        arrays, is_tuple = as_list(outputs)
        sent = Message([data_of(y) for y in arrays], TUPLE if is_tuple else 0)
        for edge in self.graph.outs[node]:
            if edge.local:
                step.local[(edge.id, k)] = sent
            else:
                self.transfer.send(sent, edge.dst[0], self._tag(edge, k, 0))

    def _compute(self, c: int, k: int, seg: Segment) -> Any:
        """The component's outputs; on the head's component, the loss too. Random functions
        draw micro-batch k's share of the mini-batch's numbers (or replay ``seg.seed``)."""
        sizes = self._step.batch.sizes
        with contextlib.ExitStack() as draws:
            if sizes:
                draws.enter_context(_position.batch_share(sum(sizes[:k]), sizes[k], sum(sizes)))
            if seg.seed is not None:
                draws.enter_context(_replay.replay(seg.seed))
            outputs = self.components[c](*seg.args)
            if self.graph.is_output((self.rank, c)) and self.head is not None:
                seg.loss = self.head.lossfun(outputs, self._step.batch.labels[k])
                self._step.losses.add(k, seg.loss, outputs, self.head)
        return outputs

    def _backward(self, c: int, k: int) -> None:
        step = self._step
        node = (self.rank, c)
        seg = step.segments.pop((c, k))
        if seg.outputs is None:
            with replaying(seg.rng), chainer.using_config("in_recomputing", True):
                seg.outputs = self._compute(c, k, seg)
        outs, _ = as_list(seg.outputs)
        grads: List[Any] = [None] * len(outs)
        for edge in self.graph.outs[node]:
            got = (step.local_grads.pop((edge.id, k)) if edge.local
                   else self._recv(edge.dst[0], self._tag(edge, k, 1)).arrays)
            for i, g in enumerate(got):
                if g is not None and g.size:
                    grads[i] = g if grads[i] is None else grads[i] + g
        targets: List[chainer.Variable] = []
        target_grads: List[chainer.Variable] = []
        if seg.loss is not None:
            xp = chainer.backend.get_array_module(seg.loss.array)
            targets.append(seg.loss)
            target_grads.append(chainer.Variable(
                xp.full_like(seg.loss.array, step.batch.weights[k])))
        for y, g in zip(outs, grads):
            if g is not None and isinstance(y, chainer.Variable) and y.requires_grad:
                targets.append(y)  # an input passed straight through is fine too
                target_grads.append(chainer.Variable(g))
        leaves = [x for ls in seg.inputs for x in ls if x.requires_grad]
        if targets and c in step.split and self._splits(c, targets, leaves):
            step.segments[(c, k)] = seg  # W needs it
            seg.weight_work = input_gradients(targets, target_grads, leaves)
        elif targets:
            chainer.backward(targets, target_grads)
        for edge, inputs in zip(self.graph.ins[node], seg.inputs):
            got = [x.grad for x in inputs]
            if edge.local:
                step.local_grads[(edge.id, k)] = got
            else:
                self.transfer.send(Message(got), edge.src[0], self._tag(edge, k, 1))  # None:
                # an input without a gradient, absent on the wire

    def _weights(self, c: int, ks: Sequence[int]) -> None:
        """W of component c for micro-batches ``ks`` (adjacent W actions run as one)."""
        segs = [self._step.segments.pop((c, k), None) for k in ks]
        works = [seg.weight_work for seg in segs if seg is not None]  # None: B ran it all
        weight_gradients(works, self._step.sums)
        for seg in segs:
            if seg is not None:
                seg.weight_work = []

    def _recv(self, source: int, tag: int) -> Message:
        start = time.perf_counter()
        try:
            got = self.transfer.recv(source, tag)
        except CommunicationError as e:  # same class: PeerLost stays PeerLost
            raise type(e)(f"{e}; in the pipeline, {self._where()}") from None
        self._step.meter.wait(f"wait {self._label} <- rank {source}", start,
                              time.perf_counter())
        return got

    def _where(self) -> str:
        """The action running, and its place in this rank's row of the schedule table."""
        labels = [a.label(self._single) for a in self._actions]
        i = self._index
        labels[i] = f"[{labels[i]}]"
        lo, hi = max(0, i - ROW_CONTEXT), i + ROW_CONTEXT + 1
        row = " ".join(labels[lo:hi])
        return (f"action {self._label} ({i + 1} of {len(labels)} on rank {self.rank}; its "
                f"row of the schedule: {'... ' if lo else ''}{row}"
                f"{' ...' if hi < len(labels) else ''})")

    def _tag(self, edge: Edge, k: int, direction: int) -> int:
        return (edge.id * self._step.batch.n + k) * 2 + direction
