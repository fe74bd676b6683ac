"""Stage 3: each link's parameters whole only while the link runs forward or backward.

Between updates every parameter of the model is ``None``; its shard lives in
a group of its link (``_groups``). A *unit* is a link that holds parameters
itself. Each call of a unit goes through chainer's own graph::

    forward of the unit          x ─────────────┬──> linear(x, W', b') ──> y
      (link hook, before)        token ─> Gather ┘ W', b' (allgathered whole, in place of W, b)
      (link hook, after)         W, b back; W', b' freed (``reshard_after_forward``)
    backward                     a function about to read W' or b' finds them freed: they are
                                 gathered again (function hook), the unit called before
                                 prefetched; Gather's backward reduce-scatters the gradients
                                 of W', b' into the shards and frees them

``Gather`` is a ``chainer.FunctionNode`` whose one input is a token (an
empty leaf); its rank is set to that of the unit's input of highest rank
(as if that were its input, without making it one: a tile of a spatial
grid must not meet it), so chainer's backward, which runs nodes by falling
rank, runs it right after the unit's own functions, not at the end of the
whole backward: a unit's gathered parameters and their whole gradients live
from the first of its functions' backward to the end of its own. While a
unit runs, the next unit of the last step's order is prefetched (one at a
time, posted non-blocking, and tested after every function node so that MPI
moves it meanwhile), and in backward the unit called before it.

Memory beyond the shards (stated bound, ``tests/test_optimizers_sharded_memory.py``):
at most two units' parameters gathered at a time in forward and in
backward (the running unit and the prefetched one), plus the running
unit's whole gradient and ``IN_FLIGHT`` reduction columns; with
``reshard_after_forward=False`` every unit called keeps its parameters from
its forward to its backward, as plain data parallelism would.

Every rank must call the units in the same order (the gathers are
collectives of the data axis); an evaluation on uneven shards would not, so
``optimizer.gathered()`` gathers every unit once for such a block.
"""
import contextlib
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

import chainer

from .._arrays import device_of
from ._groups import Group


class _Call:
    """One call of a unit: its gathered arrays and the variables that hold them."""

    def __init__(self, unit: "_Unit", flats: List[Any], owned: bool) -> None:
        self.unit = unit
        self.flats = flats
        self.owned = owned  # freed by this call (not the arrays of ``gathered()``)
        self.vars: List[Any] = []
        self.saved: Dict[str, Any] = {}
        self.done = False

    def views(self) -> List[Any]:
        out = []
        for g, flat in zip(self.unit.groups, self.flats):
            out += [flat[s.offset: s.offset + s.size].reshape(s.shape) for s in g.layout.slots]
        return out


class _Unit:
    """A link holding parameters itself, and its groups (one per dtype)."""

    def __init__(self, link: chainer.Link, index: int) -> None:
        self.link = link
        self.index = index
        self.groups: List[Group] = []
        self.attrs: List[str] = []  # the link's attribute of each parameter, in view order
        self.held: Optional[List[Any]] = None  # gathered by ``all_gathered``

    def nbytes(self) -> int:
        return sum(g.layout.total * g.dtype.itemsize for g in self.groups)


class Gather(chainer.FunctionNode):
    """A unit's parameters, whole (forward); their gradients reduce-scattered (backward)."""

    def __init__(self, gatherer: "Gatherer", call: _Call) -> None:
        self.gatherer = gatherer
        self.call = call

    def forward(self, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        return tuple(self.call.views())

    def backward(self, indexes: Tuple[int, ...], grad_outputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        self.gatherer.reduce(self.call, [None if g is None else g.array for g in grad_outputs])
        return (None,) * len(indexes)


class _LinkHook(chainer.LinkHook):
    name = "mnpar_stage3"

    def __init__(self, gatherer: "Gatherer") -> None:
        self.gatherer = gatherer

    def forward_preprocess(self, args: Any) -> None:
        self.gatherer.enter(args.link, args.args, args.kwargs)

    def forward_postprocess(self, args: Any) -> None:
        self.gatherer.leave(args.link)


class _FunctionHook(chainer.FunctionHook):
    """Gathers freed parameters before a function reads them in backward. It is one of
    chainer's global (per thread) hooks, so it holds its gatherer weakly: an optimizer
    dropped without ``free`` leaves an inert hook, which the next gatherer removes."""

    def __init__(self, gatherer: "Gatherer", name: str) -> None:
        self.gatherer = weakref.ref(gatherer)
        self.name = name

    def backward_preprocess(self, function: Any, in_data: Any, out_grad: Any) -> None:
        gatherer = self.gatherer()
        if gatherer is not None and gatherer.freed:
            gatherer.before_backward_of(function)

    def forward_postprocess(self, function: Any, in_data: Any) -> None:
        gatherer = self.gatherer()
        if gatherer is not None and gatherer.prefetch is not None:
            gatherer.poke()

    def backward_postprocess(self, function: Any, in_data: Any, out_grad: Any) -> None:
        self.forward_postprocess(function, in_data)


class Gatherer:
    """The stage 3 machinery of one sharded optimizer (see the module docstring)."""

    def __init__(self, optimizer: Any, model: chainer.Link, groups: List[Group],
                 unit_of: Dict[int, chainer.Link]) -> None:
        self.optimizer = optimizer
        self.collectives = optimizer._collectives
        self.units: Dict[int, _Unit] = {}
        for g in groups:
            link = unit_of[id(g.params[0])]
            unit = self.units.setdefault(id(link), _Unit(link, len(self.units)))
            unit.groups.append(g)
            names = {id(link.__dict__[a]): a for a in link._params}
            unit.attrs += [names[id(p)] for p in g.params]
        for unit in self.units.values():
            for g in unit.groups:
                with device_of(g.shard):
                    g.token = chainer.Parameter(g.xp.zeros(0, g.dtype))
            unit.link.add_hook(_LinkHook(self))
        for g in groups:
            for p in g.params:
                p.array = None  # the whole array is gone: only the shard remains
                p.cleargrad()
        self.calls: List[_Call] = []  # this step's, in forward order
        self.active: List[_Call] = []  # units inside their forward, innermost last
        self.freed: Dict[int, _Call] = {}  # id of a freed variable's node -> its call
        self.order: List[int] = []  # the units of the last step's calls, in order
        self.prefetch: Optional[Tuple[Any, List[Any]]] = None  # (key, started gathers)
        self.gathered_bytes = 0
        self.peak_gathered_bytes = 0
        hooks = chainer.get_function_hooks()
        for name, hook in list(hooks.items()):
            if isinstance(hook, _FunctionHook) and hook.gatherer() is None:
                del hooks[name]
        self._hook = _FunctionHook(self, f"mnpar_stage3_{id(self)}")
        hooks[self._hook.name] = self._hook

    # -- gathering ---------------------------------------------------------------

    def _start(self, unit: _Unit) -> List[Any]:
        started = []
        for g in unit.groups:
            with device_of(g.shard):
                flat = g.xp.empty(g.layout.total, g.dtype)
                flat[g.lo: g.hi] = g.shard
            started.append((flat, self.collectives.start_allgather(flat, g.layout)))
        self._count(unit.nbytes())
        return started

    @staticmethod
    def _finish(started: List[Any]) -> List[Any]:
        for _, s in started:
            s.finish()
        return [flat for flat, _ in started]

    def _take(self, key: Any) -> Optional[List[Any]]:
        if self.prefetch is not None and self.prefetch[0] == key:
            started = self.prefetch[1]
            self.prefetch = None
            return self._finish(started)
        return None

    def poke(self) -> None:
        """Tests the prefetch in flight: MPI moves a non-blocking collective only inside
        MPI calls, so the function hook pokes it after every function node."""
        if self.prefetch is not None:
            for _, started in self.prefetch[1]:
                started.test()

    def _prefetch(self, key: Any, unit: _Unit) -> None:
        if self.prefetch is None:
            self.prefetch = (key, self._start(unit))

    def _count(self, nbytes: int) -> None:
        self.gathered_bytes += nbytes
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)

    def _release(self, call: _Call) -> None:
        """Frees a call's gathered arrays (its variables keep their place in the graph)."""
        for v in call.vars:
            v.array = None
            v.node.data = None
        if call.owned and call.flats:
            self._count(-call.unit.nbytes())
        call.flats = []

    # -- forward -----------------------------------------------------------------

    def enter(self, link: chainer.Link, args: Any, kwargs: Any) -> None:
        unit = self.units.get(id(link))
        if unit is None:
            return
        if unit.held is not None:
            call = _Call(unit, unit.held, owned=False)
        else:
            flats = self._take(("unit", unit.index)) or self._finish(self._start(unit))
            call = _Call(unit, flats, owned=True)
        node = Gather(self, call)
        call.vars = list(node.apply((unit.groups[0].token,)))
        x = _highest(args, kwargs)
        if x is not None:  # ranked as if the unit's input were its input (module docstring)
            node.rank = x.rank
            for v in call.vars:
                v.node._rank = node.rank + 1
        for attr, v in zip(unit.attrs, call.vars):
            call.saved[attr] = link.__dict__[attr]
            link.__dict__[attr] = v
        self.active.append(call)
        self.calls.append(call)
        position = len(self.calls)
        if position < len(self.order) and unit.held is None:
            following = self._unit(self.order[position])
            if following is not None and following is not unit and following.held is None:
                self._prefetch(("unit", following.index), following)

    def leave(self, link: chainer.Link) -> None:
        if not self.active or self.active[-1].unit.link is not link:
            return
        call = self.active.pop()
        link.__dict__.update(call.saved)
        if not chainer.config.enable_backprop:
            self._release(call)
            call.done = True
        elif self.optimizer.reshard_after_forward and call.owned:
            self._release(call)
            for v in call.vars:
                self.freed[id(v.node)] = call

    def _unit(self, index: int) -> Optional[_Unit]:
        return next((u for u in self.units.values() if u.index == index), None)

    # -- backward ----------------------------------------------------------------

    def before_backward_of(self, function: Any) -> None:
        for x in function.inputs:
            call = self.freed.get(id(x))
            if call is not None:
                self._regather(call)

    def _regather(self, call: _Call) -> None:
        for v in call.vars:
            self.freed.pop(id(v.node), None)
        call.flats = self._take(("call", id(call))) or self._finish(self._start(call.unit))
        for v, view in zip(call.vars, call.views()):
            v.array = view
            v.node.data = view
        index = self.calls.index(call) if call in self.calls else 0
        before = next((c for c in reversed(self.calls[:index])
                       if not c.done and c.owned and not c.flats), None)
        if before is not None:
            self._prefetch(("call", id(before)), before.unit)

    def reduce(self, call: _Call, grads: List[Any]) -> None:
        """Gather's backward: the gradients into the shards (mean over the ranks)."""
        offset = 0
        for g in call.unit.groups:
            n = len(g.layout.slots)
            self.collectives.reduce_scatter(grads[offset: offset + n], g.layout, g.grad_shard,
                                            accumulate=not g.fresh)
            g.fresh = False
            offset += n
        self._release(call)
        call.done = True

    # -- updates -----------------------------------------------------------------

    def before_update(self) -> None:
        """Ends the step: prefetches waited for and dropped, forwards left without a
        backward released, gradient shards no backward reached zeroed."""
        if self.prefetch is not None:
            self._count(-sum(f.nbytes for f in self._finish(self.prefetch[1])))
            self.prefetch = None
        while self.active:  # a forward that raised left its link's attributes replaced
            call = self.active.pop()
            call.unit.link.__dict__.update(call.saved)
        for call in self.calls:
            if not call.done:
                self._release(call)
                call.done = True
        self.order = [c.unit.index for c in self.calls]
        self.calls, self.freed = [], {}
        for unit in self.units.values():
            for g in unit.groups:
                if g.fresh and g.grad_shard is not None:
                    g.grad_shard[...] = 0

    def after_update(self) -> None:
        return None

    @contextlib.contextmanager
    def all_gathered(self) -> Iterator[None]:
        """Every unit gathered once, in one order on every rank; released at the end."""
        units = sorted(self.units.values(), key=lambda u: u.index)
        for unit in units:
            unit.held = self._finish(self._start(unit))
        try:
            yield
        finally:
            for unit in units:
                if unit.held is not None:
                    self._count(-unit.nbytes())
                unit.held = None

    def free(self) -> None:
        chainer.get_function_hooks().pop(self._hook.name, None)
        for unit in self.units.values():
            unit.link.delete_hook(_LinkHook.name)


def _highest(args: Any, kwargs: Any) -> Optional[chainer.Variable]:
    """The variable of highest rank among a call's arguments (one level into tuples)."""
    best = None
    for a in list(args) + list(kwargs.values()):
        for v in (a if isinstance(a, (tuple, list)) else (a,)):
            if isinstance(v, chainer.Variable) and (best is None or v.rank > best.rank):
                best = v
    return best
