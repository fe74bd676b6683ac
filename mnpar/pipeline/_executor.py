"""Runs one rank's actions, each as its own small graph segment.

A forward of component c on micro-batch k takes its inputs as fresh leaf
Variables (arrays received, or the outputs an earlier local component left
in the local queue), runs the component and keeps its outputs; the arrays go
on at once, non-blocking. Its backward calls ``chainer.backward`` on the kept
outputs with the output gradients (received, or left by a local consumer)
and passes the input leaves' ``.grad`` back to their producers. Parameters
accumulate their gradients over the micro-batches; the loss of micro-batch k
enters backward with the gradient ``size_k / batch``, so the sum is the
gradient of the mean over the whole mini-batch.

With activation recomputation a forward runs without a graph and keeps only
its input leaves (and NumPy's random state, so dropout draws the same
masks); its backward runs the forward again, with the graph, first, under
chainer's ``in_recomputing`` flag, so BatchNormalization and the other
layers that honour it update their running statistics once, not twice.

Tags: ``(edge * K + k) * 2 + direction``, unique within a step.
"""
import contextlib
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import chainer
import numpy as np

from ._graph import Edge, Graph
from ._schedule import Action
from ._transfer import Transfer

Arrays = Tuple[List[Any], bool]  # a component's output as arrays, and whether a tuple
_NO_GRAD = np.empty(0, np.float32)  # sent where an input has no gradient


class Head(NamedTuple):
    """The loss on the rank that computes it: a ``chainer.links.Classifier``'s parts."""

    lossfun: Callable[..., Any]
    accfun: Optional[Callable[..., Any]]


class Event(NamedTuple):
    """One action as it ran: its label and its start and end (``time.perf_counter``)."""

    label: str
    start: float
    end: float


class _Segment:
    """What a (component, micro-batch) keeps between its forward and backward."""

    __slots__ = ("inputs", "args", "outputs", "loss", "rng")

    def __init__(self) -> None:
        self.inputs: List[List[chainer.Variable]] = []  # per position of rank_in
        self.args: Tuple[Any, ...] = ()
        self.outputs: Any = None
        self.loss: Optional[chainer.Variable] = None
        self.rng: Any = None


def _as_list(value: Any) -> Tuple[List[Any], bool]:
    if isinstance(value, (tuple, list)):
        return list(value), True
    return [value], False


def _data(value: Any) -> Any:
    return value.array if isinstance(value, chainer.Variable) else value


def _leaf(array: Any) -> chainer.Variable:
    return chainer.Variable(array, requires_grad=array.dtype.kind == "f")


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
        self.events: List[Event] = []
        self.record = False

    def run(self, actions: Sequence[Action], inputs: Sequence[Tuple[Any, ...]],
            labels: Sequence[Any], weights: Sequence[float], train: bool,
            recompute: Callable[[int], bool]) -> Tuple[float, float]:
        """Runs ``actions``; returns the weighted loss and accuracy sums (0 without head).

        Args:
            actions: this rank's schedule.
            inputs: per micro-batch, the model's input arrays (empty where none).
            labels: per micro-batch, the labels (only with a head).
            weights: per micro-batch, its share of the mini-batch.
            train: keep graphs and run backwards (else forwards only).
            recompute: whether micro-batch k's activations are recomputed.
        """
        self._step = _Step(len(weights), inputs, labels, weights, train, recompute)
        self.events = []
        for action in actions:
            start = time.perf_counter()
            if action.backward:
                self._backward(action.component, action.microbatch)
            else:
                self._forward(action.component, action.microbatch)
            if self.record:
                single = len(self.components) == 1
                self.events.append(Event(action.label(single), start, time.perf_counter()))
        self.transfer.finish()
        step, self._step = self._step, None  # type: ignore[assignment]
        return step.loss, step.accuracy

    # -- forward -------------------------------------------------------------

    def _forward(self, c: int, k: int) -> None:
        step = self._step
        node = (self.rank, c)
        seg = _Segment()
        if self.graph.takes_inputs(node):
            seg.args = tuple(step.inputs[k])
        else:
            flags = []
            for edge in self.graph.ins[node]:
                arrays, is_tuple = (step.local.pop((edge.id, k)) if edge.local
                                    else self.transfer.recv(edge.src[0], self._tag(edge, k, 0)))
                seg.inputs.append([_leaf(a) for a in arrays])
                flags.append(is_tuple)
            seg.args = tuple(tuple(ls) if t else ls[0] for ls, t in zip(seg.inputs, flags))
        keep = step.train and not step.recompute(k)
        if step.train and not keep:
            seg.rng = np.random.get_state()
        with contextlib.nullcontext() if keep else chainer.no_backprop_mode():
            outputs = self._compute(c, k, seg)
        if keep:
            seg.outputs = outputs
        else:
            seg.loss = None  # recomputed with its graph in backward
        if step.train:
            step.segments[(c, k)] = seg
        arrays, is_tuple = _as_list(outputs)
        arrays = [_data(y) for y in arrays]
        for edge in self.graph.outs[node]:
            if edge.local:
                step.local[(edge.id, k)] = (arrays, is_tuple)
            else:
                self.transfer.send(arrays, edge.dst[0], self._tag(edge, k, 0), is_tuple)

    def _compute(self, c: int, k: int, seg: _Segment) -> Any:
        """The component's outputs; on the head's component, the loss too."""
        outputs = self.components[c](*seg.args)
        if self.graph.is_output((self.rank, c)) and self.head is not None:
            seg.loss = self.head.lossfun(outputs, self._step.labels[k])
            self._step.add_loss(k, seg.loss, outputs, self.head)
        return outputs

    # -- backward ------------------------------------------------------------

    def _backward(self, c: int, k: int) -> None:
        step = self._step
        node = (self.rank, c)
        seg = step.segments.pop((c, k))
        if seg.outputs is None:
            saved = np.random.get_state()
            np.random.set_state(seg.rng)
            with chainer.using_config("in_recomputing", True):
                seg.outputs = self._compute(c, k, seg)
            np.random.set_state(saved)
        outs, _ = _as_list(seg.outputs)
        grads: List[Any] = [None] * len(outs)
        for edge in self.graph.outs[node]:
            got = (step.local_grads.pop((edge.id, k)) if edge.local
                   else self.transfer.recv(edge.dst[0], self._tag(edge, k, 1))[0])
            for i, g in enumerate(got):
                if g is not None and g.size:
                    grads[i] = g if grads[i] is None else grads[i] + g
        targets: List[chainer.Variable] = []
        target_grads: List[chainer.Variable] = []
        if seg.loss is not None:
            xp = chainer.backend.get_array_module(seg.loss.array)
            targets.append(seg.loss)
            target_grads.append(chainer.Variable(
                xp.full_like(seg.loss.array, step.weights[k])))
        for y, g in zip(outs, grads):
            if g is not None and isinstance(y, chainer.Variable) and y.requires_grad:
                targets.append(y)  # an input passed straight through is fine too
                target_grads.append(chainer.Variable(g))
        if targets:
            chainer.backward(targets, target_grads)
        for edge, leaves in zip(self.graph.ins[node], seg.inputs):
            got = [leaf.grad for leaf in leaves]
            if edge.local:
                step.local_grads[(edge.id, k)] = got
            else:
                self.transfer.send([_NO_GRAD if g is None else g for g in got], edge.src[0],
                                   self._tag(edge, k, 1))

    def _tag(self, edge: Edge, k: int, direction: int) -> int:
        return (edge.id * self._step.n + k) * 2 + direction


class _Step:
    """The state of one step: segments kept, local queues, the loss so far."""

    def __init__(self, n: int, inputs: Sequence[Tuple[Any, ...]], labels: Sequence[Any],
                 weights: Sequence[float], train: bool, recompute: Callable[[int], bool]) -> None:
        self.n = n
        self.inputs = inputs
        self.labels = labels
        self.weights = weights
        self.train = train
        self.recompute = recompute
        self.segments: Dict[Tuple[int, int], _Segment] = {}
        self.local: Dict[Tuple[int, int], Arrays] = {}
        self.local_grads: Dict[Tuple[int, int], List[Any]] = {}
        self.loss = 0.0
        self.accuracy = 0.0
        self._counted: set = set()

    def add_loss(self, k: int, loss: chainer.Variable, y: Any, head: Head) -> None:
        """Adds micro-batch k's loss and accuracy, weighted, once."""
        if k in self._counted:
            return
        self._counted.add(k)
        self.loss += self.weights[k] * float(_data(loss))
        if head.accfun is not None:
            with chainer.no_backprop_mode():
                acc = head.accfun(y, self.labels[k])
            self.accuracy += self.weights[k] * float(_data(acc))
