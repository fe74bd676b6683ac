"""The guard: while a converted model runs, every chainer function that receives a tile is known.

``guarded(grid, root, overlap)`` wraps ``chainer.FunctionNode.apply`` for the
length of a converted forward: the one place where spatial parallelism
intercepts chainer. Every node applied there passes through ``_apply``:

    inputs marked?  no  -> a window function (convolution, pooling) on an array
         |                 that does not hold whole images: its spatial version
         |                 (``_versions``); else chainer's apply (a broadcast that
         |                 makes a parameter tile-shaped marks its output and sums
         |                 its gradient)
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
links being called (``state.calling``), so an error names the layer by its
path in the converted model.

Two functions of ``chainer.functions`` compute what makes them wrong on
tiles out of any node's sight, and are wrapped while the guard is on
(``UNSEEN``): ``F.average``'s weights (its divisor, the sum of the weights,
would be this tile's) and ``discriminative_margin_based_clustering_loss``
(it counts the labels' pixels with numpy).
"""
import contextlib
import functools
import threading
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

import chainer
import chainer.functions as F

from ..._nodes import function_name
from .._errors import SpatialError
from .._marks import Flat, Scope, Tile, array_of, mark, mark_of, state, whole_image
from ..traffic._grid import SpatialGrid
from ..traffic._sums import sum_grads
from . import _rules
from ._call import Refusal
from ._versions import window_of

_ORIGINAL = chainer.FunctionNode.apply
HOOK = "mnpar.spatial.guard"
_lock = threading.RLock()  # chainer's apply is the process's: one converted forward at a time


class _Links(chainer.LinkHook):
    """The links being called, innermost last (``state.calling``)."""

    name = HOOK

    def forward_preprocess(self, args: Any) -> None:
        state.calling.append(args.link)

    def forward_postprocess(self, args: Any) -> None:
        if state.calling and state.calling[-1] is args.link:
            state.calling.pop()


@contextlib.contextmanager
def guarded(grid: SpatialGrid, root: Optional[chainer.Link] = None,
            overlap: bool = True) -> Iterator[None]:
    """Within it, chainer's functions on tiles are checked, converted or refused; ``root``
    is the model whose layers errors name, ``overlap`` the window functions' overlap."""
    with _lock:
        outer = not state.scopes
        hook: Optional[_Links] = None
        unseen: Dict[str, Callable[..., Any]] = {}
        if outer:
            chainer.FunctionNode.apply = _apply  # type: ignore[method-assign]
            unseen = _wrap_unseen()
            if HOOK not in chainer._get_link_hooks():
                hook = _Links()
                hook.__enter__()
        state.scopes.append(Scope(grid, root, overlap))
        try:
            yield
        finally:
            state.scopes.pop()
            if outer:
                chainer.FunctionNode.apply = _ORIGINAL  # type: ignore[method-assign]
                for name, fn in unseen.items():
                    setattr(F, name, fn)
                state.marks.clear()
                state.calling.clear()
                if hook is not None:
                    hook.__exit__()


def layer() -> str:
    """The layer running now, as the converted model names it."""
    return state.layer(state.calling, "a spatial function")


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
        window = window_of(_rules.key(node))
        if window is not None and inputs and not whole_image(inputs[0]):
            scope = state.scopes[-1]
            return _converted(node, lambda: (window(node, inputs, scope.grid, scope.overlap),))
        return _into_tile(node, inputs)
    try:
        verdict = _rules.judge(node, inputs, marks)
    except Refusal as refusal:
        raise refused(node, refusal) from None
    if verdict.convert is not None:
        return _converted(node, verdict.convert)
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


def _converted(node: Any, convert: Callable[[], Sequence[Any]]) -> Tuple[Any, ...]:
    """The spatial version's outputs (it does its own sums and marks: unguarded)."""
    state.depth += 1
    try:
        return tuple(convert())
    except Refusal as refusal:
        raise refused(node, refusal) from None
    finally:
        state.depth -= 1


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


# The functions that compute out of the guard's sight, and why they cannot run on tiles.
UNSEEN = {"discriminative_margin_based_clustering_loss":
          "it counts the labels' pixels with numpy, on this rank's tile only"}


def _wrap_unseen() -> Dict[str, Callable[..., Any]]:
    """Wraps ``UNSEEN`` and ``F.average`` (``F.mean``); returns chainer's, to restore."""
    saved = {name: getattr(F, name) for name in ("average", "mean") + tuple(UNSEEN)}
    F.average = F.mean = _average(saved["average"])
    for name in UNSEEN:
        setattr(F, name, _refusing(name, saved[name]))
    return saved


def _refusing(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if any(isinstance(mark_of(a), Tile) for a in list(args) + list(kwargs.values())):
            raise SpatialError(f"F.{name} in {layer()} cannot run on tiles of the spatial "
                               f"grid: {UNSEEN[name]}; call mnpar.spatial.gather(h, grid) "
                               "first")
        return original(*args, **kwargs)
    return call


def _average(original: Callable[..., Any]) -> Callable[..., Any]:
    """``F.average`` (``F.mean``): weights along a split axis are refused, the rest is
    chainer's (its mean over split axes is converted by the guard)."""
    @functools.wraps(original)
    def average(x: Any, axis: Any = None, weights: Any = None, keepdims: bool = False) -> Any:
        m = mark_of(x)
        if weights is not None and isinstance(m, Tile):
            ndim = len(x.shape)
            axes = range(ndim) if axis is None else \
                [a % ndim for a in (axis if isinstance(axis, tuple) else (axis,))]
            split = sorted(set(axes) & set(m.split_axes(ndim)))
            if split:
                raise SpatialError(f"F.average with weights in {layer()} cannot run on tiles "
                                   f"of the spatial grid: the weights run along split axis "
                                   f"{split}; weigh the tile first (h * w_tile, w_tile = "
                                   "grid.tile of the weights) and take F.sum, or call "
                                   "mnpar.spatial.gather(h, grid) first")
        return original(x, axis, weights, keepdims)
    return average
