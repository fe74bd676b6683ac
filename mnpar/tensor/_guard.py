"""The guard: while a parallelized model runs, every chainer function that meets a part
is known.

``guarded(comm, root)`` wraps ``chainer.FunctionNode.apply`` for the length of a
parallelized forward. Every node applied there passes through ``_apply``::

    a random function?  outside mnpar.random.scope -> refused (every rank would draw
         |                                            its own numbers)
    inputs marked?  no  -> chainer's apply
        yes -> _rules.judge(node) -> refused:   TensorParallelError naming the function,
                                                the layer and the fix (every rank
                                                decides alike: marks hold the cuts)
                                  -> converted: the tensor-parallel version runs
                                  -> exact:     whole inputs cut or copied to the group,
                                                chainer's apply (a random one inside
                                                mnpar.random.sharded), outputs marked

Nodes applied inside another node's forward, or inside tensor-parallel code
that does its own collectives (``trusted``), run unguarded. ``F.linear``
(which ``L.Linear`` calls) reshapes a part by its whole shape while the
guard is on, and ``F.gumbel_softmax`` draws a part's slice. A ``LinkHook``
keeps the stack of links being called, so an error names the layer by its
path in the parallelized model.
"""
import contextlib
import sys
from typing import Any, Iterator, List, Optional

import chainer
import chainer.functions as F
import chainer.functions.connection.linear as _linear_module

from .. import random as mrandom
from .._marks import Scope
from .._nodes import function_name
from ..functions._conjugate import CopyToGroup, GatherToGroup, ScatterToGroup, copy_to_group
from . import _rules
from ._errors import Refusal, TensorParallelError
from ._marks import Shard, mark, mark_of, state, trusted

HOOK = "mnpar.tensor.guard"
_PRISTINE = chainer.FunctionNode.apply  # chainer's own, before any guard
ANOTHER = ("another guard runs chainer's functions (a model converted by "
           "mnpar.spatial.convert): a forward is split by one of spatial and tensor "
           "parallelism; compose them on a mnpar.Mesh in different parts of the job")
RANDOM_FIX = ("wrap the training in mnpar.random.scope(model, optimizer, seed=...), in one "
              "process and in every split alike: each rank then draws its slice of one "
              "process's numbers")


class _Scope(Scope):
    def __init__(self, comm: Any, root: Optional[chainer.Link]) -> None:
        super().__init__(root)
        self.comm = comm


class _Links(chainer.LinkHook):
    """The links being called, innermost last."""

    name = HOOK

    def __init__(self) -> None:
        self.stack: List[chainer.Link] = []

    def forward_preprocess(self, args: Any) -> None:
        self.stack.append(args.link)

    def forward_postprocess(self, args: Any) -> None:
        if self.stack and self.stack[-1] is args.link:
            self.stack.pop()


class _Saved:
    apply: Any = None
    linear: Any = None
    gumbel: Any = None
    hook: Optional[_Links] = None


_saved = _Saved()


@contextlib.contextmanager
def guarded(comm: Any, root: Optional[chainer.Link] = None) -> Iterator[None]:
    """Within it, chainer's functions on parts are checked, converted or refused."""
    outer = not state.scopes
    if outer:
        if chainer.FunctionNode.apply is not _PRISTINE:
            raise TensorParallelError(f"a model split by mnpar.tensor.parallelize runs while "
                                      f"{ANOTHER}")
        _saved.apply = chainer.FunctionNode.apply
        _saved.linear, _saved.gumbel = _linear_module.linear, F.gumbel_softmax
        chainer.FunctionNode.apply = _apply  # type: ignore[method-assign]
        _linear_module.linear = F.linear = _guarded_linear
        F.gumbel_softmax = _guarded_gumbel
        if HOOK not in chainer._get_link_hooks():
            _saved.hook = _Links()
            _saved.hook.__enter__()
    state.scopes.append(_Scope(comm, root))
    try:
        yield
    finally:
        state.scopes.pop()
        if outer:
            replaced = chainer.FunctionNode.apply is not _apply
            chainer.FunctionNode.apply = _saved.apply  # type: ignore[method-assign]
            _linear_module.linear = F.linear = _saved.linear
            F.gumbel_softmax = _saved.gumbel
            state.marks.clear()
            state.copies.clear()
            if _saved.hook is not None:
                _saved.hook.__exit__()
                _saved.hook = None
            if replaced and sys.exc_info()[1] is None:
                raise TensorParallelError(f"a model split by mnpar.tensor.parallelize ran "
                                          f"its forward while {ANOTHER}")


def layer() -> str:
    """The layer running now, as the parallelized model names it."""
    return state.layer(_saved.hook.stack if _saved.hook is not None else [], "a split model")


def path() -> str:
    """The path of the innermost link running now in the parallelized model ('' if none)."""
    stack = _saved.hook.stack if _saved.hook is not None else []
    for link in reversed(stack):
        for scope in reversed(state.scopes):
            name = scope.name(link)
            if name is not None:
                return name
    return ""


def refused(what: str, refusal: Refusal) -> TensorParallelError:
    fix = f"; {refusal.fix}" if refusal.fix else ""
    return TensorParallelError(f"{what} in {layer()} cannot run on parts split over the "
                               f"tensor group: {refusal.why}{fix}")


def _random_active() -> bool:
    return bool(mrandom.active())


@contextlib.contextmanager
def drawing_slice(m: Optional[Shard]) -> Iterator[None]:
    """Random draws inside it are ``m``'s slice of one process's (nothing if ``m`` is None)."""
    if m is None:
        yield
        return
    with mrandom.sharded(m.axis, m.start, m.total):
        yield


def _nested(node: Any, inputs: Any) -> Any:
    with trusted():
        return _saved.apply(node, inputs)


def _apply(node: Any, inputs: Any) -> Any:
    if state.depth or not state.scopes:
        return _saved.apply(node, inputs)
    inputs = tuple(inputs)
    if _rules.is_random(node) and not _random_active():
        raise refused(function_name(node), Refusal(
            "it draws random numbers, and outside mnpar.random.scope every rank of the "
            "group would draw its own (chainer's generator): the ranks' results would "
            "differ", RANDOM_FIX))
    marks = [mark_of(x) for x in inputs]
    if all(m is None for m in marks):
        if _rules.key(node) == "array.broadcast.BroadcastTo":
            return _into_part(node, inputs)
        return _nested(node, inputs)
    try:
        with trusted():
            verdict = _rules.judge(node, inputs, marks)
    except Refusal as refusal:
        raise refused(function_name(node), refusal) from None
    if verdict.convert is not None:
        with trusted():
            return tuple(verdict.convert())
    with drawing_slice(verdict.random):
        outputs = _nested(verdict.node or node, tuple(verdict.inputs or inputs))
    assert verdict.marks is not None
    for y, m in zip(outputs, verdict.marks(outputs)):
        mark(y, m)
    return outputs


def _into_part(node: Any, inputs: Any) -> Any:
    """A whole value broadcast to a part's shape (``F.bias`` and ``F.scale`` broadcast
    their parameter to ``x.shape``): the output is that part. The value's extent along
    the cut axis is 1 (its gradient is then summed over the group) or the whole one (it
    is cut to this rank's part first). A part's shape is told by its cut axis' extent,
    where it differs from the whole's; elsewhere the broadcast is whole, and is cut
    where it meets the part."""
    shape, source = tuple(node._shape), tuple(inputs[0].shape)
    found = None
    for ref, m in list(state.marks.values()):
        part = ref()
        if part is None:
            continue
        offset = part.ndim - m.axis  # the part's cut axis, counted from the end
        if not 0 < offset <= len(shape) or shape[len(shape) - offset] != m.extent() or \
                m.extent() == m.pre * m.total:
            continue
        along = source[len(source) - offset] if offset <= len(source) else 1
        if along not in (1, m.pre * m.total) or (along != 1 and m.pre != 1):
            continue
        candidate = (m.at(len(shape) - offset), along, offset)
        if found is not None and found[0] != candidate[0]:
            raise refused("F.broadcast_to", Refusal(
                f"it broadcasts a whole value to {shape}, the shape of parts of two cuts "
                f"({found[0].describe()} and {candidate[0].describe()})", None))
        found = candidate
    if found is None:
        return _nested(node, inputs)
    m, along, offset = found
    with trusted():
        if along != 1:
            inputs = ScatterToGroup(m.comm, len(source) - offset, m.bounds).apply(
                tuple(inputs))
        elif getattr(inputs[0], "requires_grad", False):
            inputs = CopyToGroup(m.comm).apply(tuple(inputs))
    outputs = _nested(node, inputs)
    mark(outputs[0], m)
    return outputs


def _guarded_linear(x: Any, W: Any, b: Any = None, n_batch_axes: int = 1) -> Any:
    """``F.linear``: a part with several batch axes is reshaped by its whole shape."""
    m = mark_of(x)
    if m is None or n_batch_axes == 1 or state.depth:
        return _saved.linear(x, W, b, n_batch_axes)
    if n_batch_axes <= 0:
        raise ValueError("n_batch_axes should be greater than 0.")
    whole = m.whole_shape(tuple(x.shape))
    y = _saved.linear(F.reshape(x, (-1,) + whole[n_batch_axes:]), W, b)
    return F.reshape(y, whole[:n_batch_axes] + (-1,))


def _guarded_gumbel(log_pi: Any, tau: float = 0.1, axis: int = 1) -> Any:
    """``F.gumbel_softmax``: a part draws its slice of one process's noise."""
    m = mark_of(log_pi)
    if not _random_active():
        raise refused("F.gumbel_softmax", Refusal(
            "it draws random numbers, and outside mnpar.random.scope every rank of the "
            "group would draw its own", RANDOM_FIX))
    if m is not None and m.pre != 1:
        raise refused("F.gumbel_softmax", Refusal(f"it draws for {m.describe()}",
                                                  "draw before the reshape"))
    with drawing_slice(m):
        return _saved.gumbel(log_pi, tau, axis)


def copied(comm: Any, x: Any) -> Any:
    """``copy_to_group(comm, x)``, made once per forward for each ``x``: the layers that
    read one input (queries, keys and values) share one allreduce of its gradient."""
    return _once(("copy", id(comm), id(x)), x, lambda: copy_to_group(comm, x))


def gathered(comm: Any, x: Any, axis: int) -> Any:
    """``gather_to_group(comm, x, axis)``, made once per forward for each ``x``: the
    layers that read one part of a sequence share one allgather (and one
    reduce-scatter of its gradient)."""
    def gather() -> Any:
        with trusted():
            return GatherToGroup(comm, axis).apply((x,))[0]

    return _once(("gather", id(comm), id(x), axis), x, gather)


def _once(key: Any, x: Any, make: Any) -> Any:
    if not state.scopes:
        return make()
    entry = state.copies.get(key)
    if entry is not None and entry[0] is x:
        return entry[1]
    y = make()
    state.copies[key] = (x, y)
    return y
