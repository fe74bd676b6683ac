"""The verdicts of ``_rules``' table: how each kind of chainer function meets parts.

Each rule takes the call (the function node, its inputs and their marks)
and returns a ``Verdict``: the marks of the outputs (the function is exact
on parts as it is), possibly with some inputs replaced first (a whole value
that needs a gradient goes through ``copy_to_group``; a whole value that
runs along the cut axis is cut to this rank's part), a node to run instead
(a reshape to this rank's shape), or a conversion (a tensor-parallel
version computes what the function computes on the whole arrays); or it
raises a ``Refusal``.
"""
from typing import Any, Callable, List, NamedTuple, Optional, Sequence

import chainer

from ..functions._conjugate import CopyToGroup, ScatterToGroup
from ._errors import GATHER, Refusal
from ._layout import inserted, norm_axes, permutation, permuted, removed, reshaped
from ._marks import Shard, array_of

Marks = Callable[[Sequence[Any]], List[Optional[Shard]]]


class Verdict(NamedTuple):
    """What the guard does with a node: ``marks`` for its outputs after running
    ``node`` (or the original) on ``inputs`` (or the originals); or ``convert``."""

    marks: Optional[Marks] = None
    inputs: Optional[Sequence[Any]] = None
    node: Any = None
    convert: Optional[Callable[[], Any]] = None
    random: Optional[Shard] = None


class Call:
    """A node about to run on parts, its inputs and their marks."""

    def __init__(self, node: Any, inputs: Sequence[Any], marks: Sequence[Optional[Shard]]):
        self.node = node
        self.inputs = list(inputs)
        self.marks = list(marks)
        self.shapes = [tuple(array_of(x).shape) for x in inputs]
        self.first = next(i for i, m in enumerate(marks) if m is not None)
        first = marks[self.first]
        assert first is not None
        self.mark: Shard = first
        self.comm = first.comm
        self.ndim = len(self.shapes[self.first])

    def same_parts(self) -> None:
        """Every marked input is cut alike, counted from the last axis (broadcasting)."""
        m, n = self.mark, self.ndim
        for i, other in enumerate(self.marks):
            if other is None or i == self.first:
                continue
            if (other.total, other.bounds, other.pre, len(self.shapes[i]) - other.axis) != (
                    m.total, m.bounds, m.pre, n - m.axis) or other.comm is not m.comm:
                raise Refusal(f"its inputs are cut differently: input {self.first} is "
                              f"{m.describe()}, input {i} {other.describe()}", GATHER)


def _all(mark: Optional[Shard]) -> Marks:
    return lambda outputs: [mark] * len(outputs)


def _needs_grad(x: Any) -> bool:
    return isinstance(x, chainer.Variable) and x.requires_grad


def whole_inputs(call: Call, offset: Optional[int] = None) -> Verdict:
    """The whole inputs of a call on parts: those that run along the cut axis (``offset``
    from the last axis; None: none may) are cut to this rank's part, those that need a
    gradient get it summed over the group; the rest (constants, or of extent 1 there)
    pass as they are."""
    m = call.mark
    inputs = list(call.inputs)
    copies = []
    for i, (x, shape, mark) in enumerate(zip(call.inputs, call.shapes, call.marks)):
        if mark is not None:
            continue
        e = shape[len(shape) - offset] if offset is not None and len(shape) >= offset else 1
        if e == 1:
            if _needs_grad(x):
                copies.append(i)
            continue
        if e != m.pre * m.total or m.pre != 1:
            raise Refusal(f"its input {i} (shape {shape}) is whole on every rank and runs "
                          f"along the cut axis with {e} entries, but the cut axis has "
                          f"{m.pre * m.total}", GATHER)
        assert offset is not None
        axis = len(shape) - offset
        inputs[i] = ScatterToGroup(m.comm, axis, m.bounds).apply((x,))[0]
    if copies:
        copied = CopyToGroup(m.comm).apply(tuple(inputs[i] for i in copies))
        for i, y in zip(copies, copied):
            inputs[i] = y
    return Verdict(inputs=inputs)


def pointwise(call: Call) -> Verdict:
    """Elementwise with numpy broadcasting: parts line up from the last axis."""
    call.same_parts()
    offset = call.ndim - call.mark.axis
    replaced = whole_inputs(call, offset)
    out_ndim = max(len(s) for s in call.shapes)
    return replaced._replace(marks=_all(call.mark.at(out_ndim - offset)))


def random_pointwise(call: Call) -> Verdict:
    """A random function on parts: drawn as the slice of one process's draw."""
    verdict = pointwise(call)
    if call.mark.pre != 1:
        raise Refusal(f"it draws random numbers for {call.mark.describe()}, which is no "
                      "slice of one axis", "draw before the reshape that merged the cut axis")
    return verdict._replace(random=call.mark)


def along(attr: str, default: Optional[int] = None) -> Callable[[Call], Verdict]:
    """Exact unless the node's axis or axes (attribute ``attr``) include the cut axis;
    every other input must be cut alike."""
    def rule(call: Call) -> Verdict:
        axis = getattr(call.node, attr, default) if attr else default
        if axis is None:
            raise Refusal("it works on the flattened array", GATHER)
        if call.mark.axis in norm_axes(axis, call.ndim):
            raise Refusal(f"it works along the cut axis {call.mark.axis}", GATHER)
        parts_only(call)
        return Verdict(marks=_all(call.mark))
    return rule


def parts_only(call: Call) -> None:
    """Every input is a part, cut alike."""
    for i, m in enumerate(call.marks):
        if m is None:
            raise Refusal(f"its input {i} (shape {call.shapes[i]}) is whole where the others "
                          "are parts", GATHER)
    call.same_parts()


def reduction(convert: Optional[Callable[[Call], Any]] = None,
              keep: Callable[[Any], bool] = lambda node: bool(getattr(node, "keepdims", False)),
              axes_of: Callable[[Call], Any] = lambda call: call.node.axis) -> Callable[
                  [Call], Verdict]:
    """Exact over axes that are not cut; over the cut axis converted (or refused)."""
    def rule(call: Call) -> Verdict:
        axes = norm_axes(axes_of(call), call.ndim)
        if call.mark.axis in axes:
            if convert is None:
                raise Refusal(f"it reduces over the cut axis {call.mark.axis}", GATHER)
            return Verdict(convert=lambda: convert(call))
        m = call.mark if keep(call.node) else removed(call.mark, call.ndim, axes, "it")
        return Verdict(marks=_all(m))
    return rule


def reshape(call: Call) -> Verdict:
    local, m = reshaped(call.mark, call.shapes[0], call.node.shape)
    return Verdict(marks=_all(m), node=type(call.node)(local))


def transpose(call: Call) -> Verdict:
    axes = call.node.axes
    perm = (tuple(reversed(range(call.ndim))) if axes is None
            else tuple(int(a) % call.ndim for a in axes))
    return Verdict(marks=_all(permuted(call.mark, perm)))


def moved(fn: Callable[[Any, Any], Any]) -> Callable[[Call], Verdict]:
    def rule(call: Call) -> Verdict:
        return Verdict(marks=_all(permuted(call.mark, permutation(
            lambda a: fn(call.node, a), call.ndim))))
    return rule


def expand_dims(call: Call) -> Verdict:
    return Verdict(marks=_all(inserted(call.mark, call.ndim, call.node.axis)))


def squeeze(call: Call) -> Verdict:
    if call.node.axis is None:
        raise Refusal("it squeezes every axis of extent 1, and a part's extents are not the "
                      "whole array's", "name the axis: F.squeeze(h, axis=...)")
    axes = norm_axes(call.node.axis, call.ndim)
    return Verdict(marks=_all(removed(call.mark, call.ndim, axes, "it")))


def separate(call: Call) -> Verdict:
    axes = norm_axes(call.node.axis, call.ndim)
    return Verdict(marks=_all(removed(call.mark, call.ndim, axes, "separate")))


def stack(call: Call) -> Verdict:
    parts_only(call)
    return Verdict(marks=_all(inserted(call.mark, call.ndim, call.node.axis)))


def broadcast_to(call: Call) -> Verdict:
    shape = tuple(call.node._shape)
    offset = call.ndim - call.mark.axis
    if shape[len(shape) - offset] != call.shapes[0][call.mark.axis]:
        raise Refusal(f"it broadcasts {call.mark.describe()} to {shape}", GATHER)
    return Verdict(marks=_all(call.mark.at(len(shape) - offset)))


def get_item(call: Call) -> Verdict:
    """Basic indexing that leaves the cut axis whole (``h[:, -1]`` on other axes)."""
    index = call.node.slices
    index = index if isinstance(index, tuple) else (index,)
    if any(not (i is None or i is Ellipsis or isinstance(i, (int, slice))) for i in index):
        raise Refusal("it indexes with arrays", GATHER)
    if index.count(Ellipsis) > 1:
        raise Refusal("it has two ellipses", None)
    taken = sum(i is not None and i is not Ellipsis for i in index)
    if Ellipsis in index:
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (call.ndim - taken) + index[at + 1:]
    index = index + (slice(None),) * (call.ndim - sum(i is not None for i in index))
    axis = out = 0
    for i in index:
        if i is None:
            out += 1
            continue
        if axis == call.mark.axis:
            if i != slice(None):
                raise Refusal(f"it indexes the cut axis {axis} with {i!r}", GATHER)
            return Verdict(marks=_all(call.mark.at(out)))
        out += isinstance(i, slice)
        axis += 1
    raise AssertionError("the cut axis was not reached")


def matmul(call: Call) -> Verdict:
    """``F.matmul``: exact on parts of a batch axis of both, of ``a``'s rows, or of ``b``'s
    columns; parts of the contracted axis would be partial sums."""
    node = call.node
    (a, b), (ma, mb) = call.shapes, call.marks
    if len(a) < 2 or len(b) < 2 or node.transc:
        raise Refusal("it multiplies vectors or transposes its result", GATHER)
    rows = len(a) - (1 if node.transa else 2)
    cols = len(b) - (2 if node.transb else 1)
    out = max(len(a), len(b))
    if ma is not None and mb is not None:
        call.same_parts()
        if ma.axis < len(a) - 2 and len(a) - ma.axis == len(b) - mb.axis:
            return Verdict(marks=_all(ma.at(out - (len(a) - ma.axis))))
    elif ma is not None and ma.axis == rows:
        return whole_inputs(call)._replace(marks=_all(ma.at(out - 2)))
    elif mb is not None and mb.axis == cols:
        return whole_inputs(call)._replace(marks=_all(mb.at(out - 1)))
    elif ma is not None and ma.axis < len(a) - 2 and len(b) == 2:
        return whole_inputs(call)._replace(marks=_all(ma))
    raise Refusal("its parts meet along the contracted axis (each rank would hold a partial "
                  "sum) or a batch axis of one input only",
                  "plan the layer that makes them 'row' (it sums the parts), or " + GATHER)


def on_axes(axes: Sequence[int], fix: str, what: str = "") -> Callable[[Call], Verdict]:
    """Exact on parts of the first input's ``axes`` (a batch axis of a layer of one
    sample at a time, or channels of a function of one channel at a time); the other
    inputs (weights) are whole and get their gradients summed."""
    def rule(call: Call) -> Verdict:
        if call.first != 0 or call.mark.axis not in axes:
            raise Refusal(f"its input {call.first} is {call.mark.describe()}{what}", fix)
        for i, m in enumerate(call.marks[1:], 1):
            if m is not None:
                raise Refusal(f"its input {i} is a part too", fix)
        return whole_inputs(call)._replace(marks=_all(call.mark))
    return rule


def refuse(why: str, fix: Optional[str] = GATHER) -> Callable[[Call], Verdict]:
    def rule(call: Call) -> Verdict:
        raise Refusal(why, fix)
    return rule


def when(attr: str, ok: Sequence[Any], then: Callable[[Call], Verdict],
         fix: str = GATHER) -> Callable[[Call], Verdict]:
    """``then``'s rule where the node's ``attr`` is one of ``ok``; else refused."""
    def rule(call: Call) -> Verdict:
        value = getattr(call.node, attr, None)
        if value not in ok:
            raise Refusal(f"it runs with {attr}={value!r} on parts", fix)
        return then(call)
    return rule
