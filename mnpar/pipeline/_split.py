"""A backward split in two: B, the gradients of a segment's inputs, now; W, its weights', later.

In the zero-bubble schedules B asks ``chainer.grad`` for the inputs'
gradients only: chainer then walks only the paths to the inputs, and a
LinearFunction or a convolution on such a path computes its input gradient
and not its weight gradient. A function hook records, for every function
node B runs that takes a parameter, the gradients of its outputs; W then
asks each such node for that parameter's gradient alone
(``FunctionNode.backward`` with the parameter's index) and adds it to the
parameter's ``grad``. B followed by W gives what one ``chainer.backward``
gives (``tests/test_pipeline_split.py``, in one process)::

    x --Linear(W1)--> h --relu--> --Linear(W2)--> y        (g: y's gradient)
    B: chainer.grad([y], [x], [g])   x.grad; records Linear(W2)'s and
                                     Linear(W1)'s output gradients
    W: each recorded Linear          W1.grad, b1.grad, W2.grad, b2.grad

A component whose parameters reach the graph other than as direct inputs
of a node on those paths (a parameter reshaped first, say) cannot be split
this way (``unsplittable`` says why): its B runs the whole backward, its W
does nothing, and a ``PipelineWarning`` says so once.
"""
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import chainer
from chainer.functions.connection.linear import LinearFunction

# What W computes for one micro-batch: (function node, its outputs' gradients) from B.
WeightWork = List[Tuple[Any, Tuple[Any, ...]]]


class PipelineWarning(UserWarning):
    """Something the pipeline does differently from what its schedule asked."""


class _Recorder(chainer.FunctionHook):
    """Records each function node a backward runs that takes a parameter, with its
    outputs' gradients (what W needs; the other nodes' gradients are let go)."""

    name = "mnpar-pipeline-split-backward"

    def __init__(self) -> None:
        self.nodes: WeightWork = []

    def backward_preprocess(self, function: Any, in_data: Any, out_grad: Any) -> None:
        if any(isinstance(x.get_variable_or_none(), chainer.Parameter)
               for x in function.inputs):
            self.nodes.append((function, out_grad))


def input_gradients(targets: List[chainer.Variable], target_grads: List[chainer.Variable],
                    leaves: List[chainer.Variable]) -> WeightWork:
    """B: sets each of ``leaves``' ``grad_var`` to its gradient; returns what W needs."""
    recorder = _Recorder()
    with recorder:
        got = chainer.grad(targets, leaves, target_grads)
    for leaf, g in zip(leaves, got):
        leaf.grad_var = g
    return recorder.nodes


class Accumulator:
    """Adds gradients into ``param.grad``: in place once the sum is an array of its
    own, never into one a function returned (chainer may share it)."""

    def __init__(self) -> None:
        self._owned: Dict[int, Any] = {}  # id -> the array itself, so no id is reused

    def add(self, param: Any, g: Any) -> None:
        if param.grad is None:
            param.grad = g
        elif self._owned.get(id(param.grad)) is param.grad:
            param.grad += g
        else:
            param.grad = param.grad + g
            self._owned[id(param.grad)] = param.grad


def weight_gradients(works: Sequence[WeightWork], sums: Accumulator) -> None:
    """W of one component for several micro-batches (``works``, one per micro-batch):
    each recorded node's gradient for the parameters it takes, added in.

    A LinearFunction's weight gradient for several micro-batches is one
    product of their stacked inputs and output gradients, not one each (one
    larger product takes less time than several small ones: docs/pipeline.rst);
    other nodes run their own ``backward`` per micro-batch.
    """
    if len(works) > 1 and any(
            len(w) != len(works[0]) or any(type(a[0]) is not type(b[0])
                                           for a, b in zip(w, works[0]))
            for w in works):
        groups = [[entry] for work in works for entry in work]
    else:
        groups = [list(entries) for entries in zip(*works)]
    with chainer.using_config("enable_backprop", False):
        for entries in groups:
            _node_weights(entries, sums)


def _node_weights(entries: WeightWork, sums: Accumulator) -> None:
    """The parameter gradients of one node, over one or more micro-batches."""
    node = entries[0][0]
    params = [(i, x.get_variable_or_none()) for i, x in enumerate(node.inputs)]
    params = [(i, p) for i, p in params if isinstance(p, chainer.Parameter) and p.requires_grad]
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
            sums.add(param, g)
        return
    for node, out_grads in entries:
        gys = tuple(None if g is None else chainer.Variable(g) for g in out_grads)
        gxs = node.backward(indexes, gys)
        if len(gxs) == len(node.inputs) != len(indexes):  # chainer's other form
            gxs = tuple(gxs[i] for i in indexes)
        for (_, param), g in zip(params, gxs):
            if g is not None:
                sums.add(param, g.array)


class SplitCheck:
    """Whether each component's backward splits into B and W, decided at its first B
    (``unsplittable``); a component that cannot is warned about once."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._known: Dict[int, bool] = {}

    def __call__(self, c: int, targets: List[chainer.Variable],
                 leaves: List[chainer.Variable]) -> bool:
        if c not in self._known:
            why = unsplittable(targets, leaves)
            self._known[c] = why is None
            if why is not None:
                warnings.warn(
                    f"pipeline: rank {self.rank} component {c}'s backward cannot be split "
                    f"into input and weight gradients ({why}); its B runs the whole "
                    "backward and its W actions do nothing, so the schedule loses what W "
                    "would have filled", PipelineWarning, stacklevel=2)
        return self._known[c]


def functions_behind(variables: Sequence[chainer.Variable],
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


def unsplittable(targets: List[chainer.Variable],
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
    for node in functions_behind(targets, lambda x: x.requires_grad):
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
