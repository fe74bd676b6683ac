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

In the zero-bubble schedules a split component's B asks ``chainer.grad``
for its inputs' gradients only: chainer then walks only the paths to the
inputs, and a LinearFunction or a convolution on such a path computes its
input gradient and not its weight gradient. A function hook records, for
every function node B runs, the gradients of its outputs; W then asks each
node that takes a parameter for that parameter's gradient alone
(``FunctionNode.backward`` with the parameter's index) and adds it to the
parameter's ``grad``. A component whose parameters reach the graph other
than as direct inputs of a node on those paths (a parameter reshaped first,
say) cannot be split this way: its B runs the whole backward, its W does
nothing, and a ``PipelineWarning`` says so once.

With activation recomputation a forward runs without a graph and keeps only
its input leaves (and NumPy's random state, so dropout draws the same
masks); its backward runs the forward again, with the graph, first, under
chainer's ``in_recomputing`` flag, so BatchNormalization and the other
layers that honour it update their running statistics once, not twice.

Tags: ``(edge * K + k) * 2 + direction``, unique within a step.
"""
import contextlib
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

import chainer
import numpy as np
from chainer.functions.connection.linear import LinearFunction

from .._errors import CommunicationError
from ._graph import Edge, Graph
from ._schedule import Action
from ._transfer import Transfer

Arrays = Tuple[List[Any], bool]  # a component's output as arrays, and whether a tuple
_NO_GRAD = np.empty(0, np.float32)  # sent where an input has no gradient


class Head(NamedTuple):
    """The loss on the rank that computes it: a ``chainer.links.Classifier``'s parts."""

    lossfun: Callable[..., Any]
    accfun: Optional[Callable[..., Any]]


class PipelineWarning(UserWarning):
    """Something the pipeline does differently from what its schedule asked."""


class Event(NamedTuple):
    """One action as it ran, or a wait for a message (``wait F3.c0 <- rank 1``):
    its label and its start and end (``time.perf_counter``)."""

    label: str
    start: float
    end: float


WAIT_EVENT = 50e-6  # a receive that waited longer shows as its own event
ROW_CONTEXT = 6  # actions shown on each side of the one a failed wait is in


class _Recorder(chainer.FunctionHook):
    """Records each function node a backward runs that takes a parameter, with its
    outputs' gradients (what W needs; the other nodes' gradients are let go)."""

    name = "mnpar-pipeline-split-backward"

    def __init__(self) -> None:
        self.nodes: List[Tuple[Any, Tuple[Any, ...]]] = []

    def backward_preprocess(self, function: Any, in_data: Any, out_grad: Any) -> None:
        if any(isinstance(x.get_variable_or_none(), chainer.Parameter)
               for x in function.inputs):
            self.nodes.append((function, out_grad))


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


class _Segment:
    """What a (component, micro-batch) keeps between its forward and backward."""

    __slots__ = ("inputs", "args", "outputs", "loss", "rng", "weight_work")

    def __init__(self) -> None:
        self.inputs: List[List[chainer.Variable]] = []  # per position of rank_in
        self.args: Tuple[Any, ...] = ()
        self.outputs: Any = None
        self.loss: Optional[chainer.Variable] = None
        self.rng: Any = None
        # What W computes: (function node, its outputs' gradients) from B.
        self.weight_work: List[Tuple[Any, Tuple[Any, ...]]] = []


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
        self.measure = False  # track live segments' bytes (tests, benchmarks)
        self.peak_segments = 0
        self.peak_bytes = 0
        self.segment_bytes = 0  # the largest one segment held
        self._splits: Dict[int, bool] = {}  # component -> whether B and W run apart
        self._actions: Sequence[Action] = ()  # the step's, and the one running (_where)
        self._index = 0
        self._single = True
        self._label = ""

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
        self._step.split = {a.component for a in actions if a.weight}
        self.events = []
        self.peak_segments = self.peak_bytes = self.segment_bytes = 0
        single = len(self.components) == 1
        with _Progress(self.transfer):
            self._run(actions, single)
        try:
            self.transfer.finish()
        except CommunicationError as e:
            raise type(e)(f"{e}; in the pipeline, at the end of the step (its sends "
                          "to be received)") from None
        step, self._step = self._step, None  # type: ignore[assignment]
        return step.loss, step.accuracy

    def _run(self, actions: Sequence[Action], single: bool) -> None:
        self._actions, self._single = actions, single
        i = 0
        while i < len(actions):
            self._index = i
            action = actions[i]
            self._label = action.label(single)
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
            if self.record:
                self.events.append(Event(self._label, start, time.perf_counter()))
            if self.measure:
                self._measure()
            i += 1

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
                                    else self._recv(edge.src[0], self._tag(edge, k, 0)))
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
                   else self._recv(edge.dst[0], self._tag(edge, k, 1))[0])
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
        leaves = [leaf for ls in seg.inputs for leaf in ls if leaf.requires_grad]
        if targets and c in step.split and self._splittable(c, targets, leaves):
            step.segments[(c, k)] = seg  # W needs it
            recorder = _Recorder()
            with recorder:
                got = chainer.grad(targets, leaves, target_grads)
            for leaf, g in zip(leaves, got):
                leaf.grad_var = g
            seg.weight_work = recorder.nodes
        elif targets:
            chainer.backward(targets, target_grads)
        for edge, leaves in zip(self.graph.ins[node], seg.inputs):
            got = [leaf.grad for leaf in leaves]
            if edge.local:
                step.local_grads[(edge.id, k)] = got
            else:
                self.transfer.send([_NO_GRAD if g is None else g for g in got], edge.src[0],
                                   self._tag(edge, k, 1))

    def _weights(self, c: int, ks: Sequence[int]) -> None:
        """W of component c for micro-batches ``ks`` (adjacent W actions run as one):
        each recorded node's gradient for the parameters it takes, added in.

        A LinearFunction's weight gradient for several micro-batches is one
        product of their stacked inputs and output gradients, not one each
        (half the time of two at 128 rows a layer of 1024); other nodes run
        their own ``backward`` per micro-batch.
        """
        segs = [self._step.segments.pop((c, k), None) for k in ks]
        works = [seg.weight_work for seg in segs if seg is not None]  # None: B ran it all
        if len(works) > 1 and any(
                len(w) != len(works[0]) or any(type(a[0]) is not type(b[0])
                                               for a, b in zip(w, works[0]))
                for w in works):
            groups = [[entry] for work in works for entry in work]
        else:
            groups = [list(entries) for entries in zip(*works)]
        with chainer.using_config("enable_backprop", False):
            for entries in groups:
                self._node_weights(entries)
        for seg in segs:
            if seg is not None:
                seg.weight_work = []

    def _node_weights(self, entries: List[Tuple[Any, Tuple[Any, ...]]]) -> None:
        """The parameter gradients of one node, over one or more micro-batches."""
        node = entries[0][0]
        params = [(i, x.get_variable_or_none()) for i, x in enumerate(node.inputs)]
        params = [(i, p) for i, p in params
                  if isinstance(p, chainer.Parameter) and p.requires_grad]
        if not params:
            return
        indexes = tuple(i for i, _ in params)
        if len(entries) > 1 and isinstance(node, LinearFunction) and indexes in ((1,), (1, 2)):
            xp = chainer.backend.get_array_module(entries[0][1][0])
            x = xp.concatenate([n.inputs[0].data for n, _ in entries])
            gy = xp.concatenate([g[0] for _, g in entries])
            grads = [gy.T.dot(x).astype(params[0][1].dtype, copy=False)]
            if len(indexes) == 2:
                grads.append(gy.sum(axis=0))
            for (_, param), g in zip(params, grads):
                self._accumulate(param, g)
            return
        for node, out_grads in entries:
            gys = tuple(None if g is None else chainer.Variable(g) for g in out_grads)
            gxs = node.backward(indexes, gys)
            if len(gxs) == len(node.inputs) != len(indexes):  # chainer's other form
                gxs = tuple(gxs[i] for i in indexes)
            for (_, param), g in zip(params, gxs):
                if g is not None:
                    self._accumulate(param, g.array)

    def _accumulate(self, param: Any, g: Any) -> None:
        """Adds ``g`` to ``param.grad``: in place once the sum is an array of ours,
        never into one a function returned (it may share it, as chainer may)."""
        owned = self._step.owned  # id -> the array itself, so no id is reused
        if param.grad is None:
            param.grad = g
        elif owned.get(id(param.grad)) is param.grad:
            param.grad += g
        else:
            param.grad = param.grad + g
            owned[id(param.grad)] = param.grad

    def _splittable(self, c: int, targets: List[chainer.Variable],
                    leaves: List[chainer.Variable]) -> bool:
        """Whether component c's backward splits into B and W; decided at its first B."""
        if c not in self._splits:
            why = _unsplittable(targets, leaves)
            self._splits[c] = why is None
            if why is not None:
                warnings.warn(
                    f"pipeline: rank {self.rank} component {c}'s backward cannot be split "
                    f"into input and weight gradients ({why}); its B runs the whole "
                    "backward and its W actions do nothing, so the schedule loses what W "
                    "would have filled", PipelineWarning, stacklevel=2)
        return self._splits[c]

    def _recv(self, source: int, tag: int) -> Tuple[List[Any], bool]:
        start = time.perf_counter()
        try:
            got = self.transfer.recv(source, tag)
        except CommunicationError as e:  # same class: PeerLost stays PeerLost
            raise type(e)(f"{e}; in the pipeline, {self._where()}") from None
        end = time.perf_counter()
        if self.record and end - start > WAIT_EVENT:
            self.events.append(Event(f"wait {self._label} <- rank {source}", start, end))
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

    def _measure(self) -> None:
        """The live segments' count and bytes, and the peaks since the step began."""
        live = list(self._step.segments.values())
        sizes = [_bytes(seg) for seg in live]
        self.peak_segments = max(self.peak_segments, len(live))
        self.peak_bytes = max(self.peak_bytes, sum(sizes))
        self.segment_bytes = max([self.segment_bytes] + sizes)

    def _tag(self, edge: Edge, k: int, direction: int) -> int:
        return (edge.id * self._step.n + k) * 2 + direction


def _functions_behind(variables: Sequence[chainer.Variable],
                      follow: Callable[[Any], bool]) -> Iterator[Any]:
    """Every function node behind ``variables``, each once, walking back through
    the input variable nodes ``follow`` accepts."""
    todo = [v.creator_node for v in variables if v.creator_node is not None]
    seen: Set[Any] = set()
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        yield node
        todo.extend(x.creator_node for x in node.inputs
                    if follow(x) and x.creator_node is not None)


def _unsplittable(targets: List[chainer.Variable],
                  leaves: List[chainer.Variable]) -> Optional[str]:
    """Why B (the inputs' gradients) and W (each node's parameter gradients) would
    not give the whole backward; None if they would.

    Every function node behind ``targets`` that some gradient flows through
    must lie on a path from ``leaves`` (B runs it), and each of its inputs
    off those paths must be a parameter (W computes it from that node alone).
    """
    if not leaves:
        return "no input that takes a gradient"
    users: Dict[Any, List[Any]] = {}  # variable node -> function nodes that take it
    behind: Set[Any] = set()
    for node in _functions_behind(targets, lambda x: x.requires_grad):
        behind.add(node)
        for x in node.inputs:
            if x.requires_grad:
                users.setdefault(x, []).append(node)
    reached: Set[Any] = set()
    on_path: Set[Any] = set()
    frontier = [leaf.node for leaf in leaves]
    while frontier:
        x = frontier.pop()
        on_path.add(x)
        for node in users.get(x, []):
            if node not in reached:
                reached.add(node)
                frontier.extend(y() for y in node.outputs if y() is not None)
    off = behind - reached
    if off:
        return f"{next(iter(off)).label} is off the inputs' paths"
    for node in reached:
        for x in node.inputs:
            if x.requires_grad and x not in on_path and not (
                    x.creator_node is None
                    and isinstance(x.get_variable_or_none(), chainer.Parameter)):
                return f"{node.label} takes a gradient-carrying input that is not a parameter"
    return None


def _bytes(seg: "_Segment") -> int:
    """Bytes of the arrays a segment keeps: its graph's retained data, its inputs,
    outputs and, after a split B, its nodes' output gradients."""
    seen: Dict[int, int] = {}

    def add(a: Any) -> None:
        if a is not None and hasattr(a, "nbytes"):
            seen[id(a)] = a.nbytes
    for leaves in seg.inputs:
        for leaf in leaves:
            add(leaf.array)
            add(leaf.grad)
    outs, _ = _as_list(seg.outputs) if seg.outputs is not None else ([], False)
    for y in outs:
        add(_data(y))
    variables = [y for y in outs if isinstance(y, chainer.Variable)]
    for node in _functions_behind(variables, lambda x: True):
        for x in node.inputs:
            if not isinstance(x.get_variable_or_none(), chainer.Parameter):
                add(x.data)
    for _, grads in seg.weight_work:
        for g in grads:
            add(g)
    return sum(seen.values())


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
        self.split: Set[int] = set()  # components whose W is its own action
        self.owned: Dict[int, Any] = {}  # parameter gradients W allocated itself
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
