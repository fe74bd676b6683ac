"""The guard: while a converted model runs, every chainer function that receives a tile is known.

``guarded(grid)`` wraps ``chainer.FunctionNode.apply`` for the length of a
converted forward. Every node applied there passes through ``_apply``:

    inputs marked?  no  -> chainer's apply (a broadcast that makes a parameter
         |                 tile-shaped marks its output and sums its gradient)
        yes -> _rules.judge(node) -> refused:  SpatialError, naming the function,
                                               the layer and the fix (every rank
                                               decides alike: marks hold global
                                               extents)
                                  -> converted: the spatial implementation runs
                                  -> exact:     inputs that are not tiles and need
                                                a gradient go through SumGrads;
                                                chainer's apply; outputs marked

Nodes applied inside another node's forward, or inside spatial code that
does its own sums (``trusted``), run unguarded. A ``LinkHook`` keeps the
stack of links being called, so an error names the layer by its path in the
converted model.
"""
import contextlib
from typing import Any, Dict, Iterator, List, Optional

import chainer

from . import _rules
from ._call import Refusal
from ._errors import SpatialError
from ._marks import Flat, Tile, array_of, mark, mark_of, state
from ._sums import sum_grads

_ORIGINAL = chainer.FunctionNode.apply
HOOK = "mnpar.spatial.guard"


class _Scope:
    def __init__(self, grid: Any, root: Optional[chainer.Link]) -> None:
        self.grid = grid
        self.root = root
        self._names: Optional[Dict[int, str]] = None

    def name(self, link: chainer.Link) -> Optional[str]:
        if self.root is None:
            return None
        if self._names is None:
            self._names = {id(sub): path for path, sub in self.root.namedlinks()}
        return self._names.get(id(link))


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


_links: List[_Links] = []


@contextlib.contextmanager
def guarded(grid: Any, root: Optional[chainer.Link] = None) -> Iterator[None]:
    """Within it, chainer's functions on tiles are checked, converted or refused."""
    outer = not state.scopes
    hook: Optional[_Links] = None
    if outer:
        chainer.FunctionNode.apply = _apply  # type: ignore[method-assign]
        if HOOK not in chainer._get_link_hooks():
            hook = _Links()
            hook.__enter__()
            _links.append(hook)
    state.scopes.append(_Scope(grid, root))
    try:
        yield
    finally:
        state.scopes.pop()
        if outer:
            chainer.FunctionNode.apply = _ORIGINAL  # type: ignore[method-assign]
            state.marks.clear()
            if hook is not None:
                _links.remove(hook)
                hook.__exit__()


def layer() -> str:
    """The layer running now, as the converted model names it."""
    scopes = state.scopes
    stack = _links[-1].stack if _links else []
    for link in reversed(stack):
        for scope in reversed(scopes):
            path = scope.name(link)
            if path == "/":
                return f"the forward of {type(link).__name__}"
            if path is not None:
                return f"layer {path!r} ({type(link).__name__})"
    root = next((s.root for s in reversed(scopes) if s.root is not None), None)
    if stack:
        return f"layer {type(stack[-1]).__name__}"
    return f"the forward of {type(root).__name__}" if root is not None else "a spatial function"


def function_name(node: Any) -> str:
    """``F.name (Class)`` where the node's module defines one function of chainer.functions."""
    cls = type(getattr(node, "_function", None) or node)
    names = _public_names().get(cls.__module__, [])
    plain = cls.__name__.lower().replace("function", "")
    match = [n for n in names if n.replace("_", "") == plain] or names
    return f"F.{match[0]} ({cls.__name__})" if len(match) == 1 else cls.__name__


_PUBLIC: Dict[str, List[str]] = {}


def _public_names() -> Dict[str, List[str]]:
    if not _PUBLIC:
        import chainer.functions as F

        for name in dir(F):
            fn = getattr(F, name)
            if callable(fn) and not name.startswith("_") and hasattr(fn, "__module__"):
                _PUBLIC.setdefault(fn.__module__, []).append(name)
    return _PUBLIC


def refused(node: Any, refusal: Refusal) -> SpatialError:
    fix = f"; {refusal.fix}" if refusal.fix else ""
    return SpatialError(f"{function_name(node)} in {layer()} cannot run on tiles of the spatial "
                        f"grid: {refusal.why}{fix}")


def _nested(node: Any, inputs: Any) -> Any:
    state.depth += 1
    try:
        return _ORIGINAL(node, inputs)
    finally:
        state.depth -= 1


def _apply(node: Any, inputs: Any) -> Any:
    if state.depth or not state.scopes:
        return _ORIGINAL(node, inputs)
    inputs = tuple(inputs)
    marks = [mark_of(x) for x in inputs]
    if not any(isinstance(m, (Tile, Flat)) for m in marks):
        return _into_tile(node, inputs)
    try:
        verdict = _rules.judge(node, inputs, marks)
    except Refusal as refusal:
        raise refused(node, refusal) from None
    if verdict.convert is not None:  # the spatial version does its own sums and marks
        state.depth += 1
        try:
            return tuple(verdict.convert())
        except Refusal as refusal:
            raise refused(node, refusal) from None
        finally:
            state.depth -= 1
    grid = next(m.grid for m in marks if isinstance(m, (Tile, Flat)))
    wanted = [i for i, (x, m) in enumerate(zip(inputs, marks))
              if not isinstance(m, (Tile, Flat)) and getattr(x, "requires_grad", False)]
    if wanted:
        summed = sum_grads(grid, [inputs[i] for i in wanted], function_name(node))
        inputs = tuple(summed[wanted.index(i)] if i in wanted else x
                       for i, x in enumerate(inputs))
    outputs = _nested(node, inputs)
    assert verdict.marks is not None
    for y, m in zip(outputs, verdict.marks(outputs)):
        mark(y, m)
    return outputs


def _into_tile(node: Any, inputs: Any) -> Any:
    """Runs a node without tile inputs; a broadcast of a value every rank holds alike to
    a tile's shape (``F.scale``, ``F.bias``) makes a tile whose gradient is summed."""
    if _rules.key(node) != "array.broadcast.BroadcastTo":
        return _nested(node, inputs)
    shape = tuple(node._shape)
    source = tuple(array_of(inputs[0]).shape)
    tile = _tiling_of(shape, source)
    if tile is None:
        return _nested(node, inputs)
    if getattr(inputs[0], "requires_grad", False):
        inputs = sum_grads(tile.grid, inputs, "F.broadcast_to (BroadcastTo)")
    outputs = _nested(node, inputs)
    mark(outputs[0], tile)
    return outputs


def _tiling_of(shape: tuple, source: tuple) -> Optional[Tile]:
    """A tiling seen in this forward whose tile ``shape`` is, broadcast from ``source``
    (constant along the split axes): the output is marked ``spread``."""
    seen = {m._replace(spread=False) for _, m in state.marks.values() if isinstance(m, Tile)}
    for tile in sorted(seen, key=repr):
        ndim = len(shape)
        split = tile.split_axes(ndim)
        if split[0] < 0 or [shape[p] for p in split] != list(tile.local()):
            continue
        offset = ndim - len(source)
        if all(p < offset or source[p - offset] == 1 for p in split):
            return tile._replace(spread=True)
    return None
