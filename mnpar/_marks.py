"""Marks on arrays while a guarded forward runs: the registry both guards keep.

Spatial and tensor parallelism each run a split model's forward under a
guard that must know, of every array a chainer function receives, whether
this rank holds a part of it and which. Each marks its arrays with its own
kind of mark (``spatial.Tile``, ``tensor.Shard``) in its own per-thread
state; the code of that state is this module's, written once::

    scopes   the guarded forwards running, innermost last (each a ``Scope``
             or a package's subclass: the model whose layers errors name)
    depth    > 0 inside trusted code (a package's own collectives, a node's
             forward): chainer's functions run unguarded there
    marks    id(array) -> (a reference to the array, its mark)

A mark is keyed by the array's identity and checked against a weak
reference to it, so a mark dies with its array and a new array at a reused
address is never taken for the old one; an array type without weak
references keeps its mark until the forward ends. Marks exist only while a
scope runs: outside every scope ``mark`` does nothing and ``mark_of`` says
None, and the guard clears them when its outermost scope ends. A refusal
names the layer it happened in by its path in a scope's model (``layer``).
"""
import functools
import threading
import weakref
from typing import Any, Callable, Dict, Generic, List, Optional, Sequence, Tuple, TypeVar

import chainer

M = TypeVar("M")
S = TypeVar("S", bound="Scope")


class Scope:
    """One guarded forward running; ``root`` is the model whose layers errors name."""

    def __init__(self, root: Optional[chainer.Link]) -> None:
        self.root = root
        self._names: Optional[Dict[int, str]] = None

    def name(self, link: chainer.Link) -> Optional[str]:
        """``link``'s path in ``root`` (None: not one of its links); found once a forward."""
        if self.root is None:
            return None
        if self._names is None:
            self._names = {id(sub): path for path, sub in self.root.namedlinks()}
        return self._names.get(id(link))


def array_of(x: Any) -> Any:
    """The array of ``x`` (a Variable or an array)."""
    return x.array if isinstance(x, chainer.Variable) else x


class Marks(threading.local, Generic[S, M]):
    """A package's per-forward state, one per thread (see the module docstring); a package
    subclasses it with its own fields and makes one."""

    def __init__(self) -> None:
        self.scopes: List[S] = []
        self.depth = 0
        self.marks: Dict[int, Tuple[Callable[[], Any], M]] = {}

    def mark_of(self, x: Any) -> Optional[M]:
        """The mark of ``x`` (a Variable or an array), or None."""
        a = array_of(x)
        if a is None or not self.scopes:
            return None
        entry = self.marks.get(id(a))
        if entry is None or entry[0]() is not a:
            return None
        return entry[1]

    def mark(self, x: Any, m: Optional[M]) -> Any:
        """Marks ``x`` (a Variable or an array) while a guarded forward runs (None: unmarks
        it); returns ``x``."""
        a = array_of(x)
        if a is None or not self.scopes:
            return x
        key = id(a)
        if m is None:
            self.marks.pop(key, None)
            return x
        marks = self.marks

        def forget(r: Any) -> None:
            entry = marks.get(key)
            if entry is not None and entry[0] is r:
                del marks[key]

        ref: Callable[[], Any]
        try:
            ref = weakref.ref(a, forget)
        except TypeError:  # an array type without weak references: kept until the forward ends
            ref = functools.partial(_same, a)
        marks[key] = (ref, m)
        return x

    def layer(self, calling: Sequence[chainer.Link], outside: str) -> str:
        """The layer running now, for errors: the innermost of ``calling`` (the links being
        called, innermost last) by its path in a scope's model; ``outside`` where neither a
        link nor a model is known."""
        for link in reversed(calling):
            for scope in reversed(self.scopes):
                path = scope.name(link)
                if path == "/":
                    return f"the forward of {type(link).__name__}"
                if path is not None:
                    return f"layer {path!r} ({type(link).__name__})"
        if calling:
            return f"layer {type(calling[-1]).__name__}"
        root = next((s.root for s in reversed(self.scopes) if s.root is not None), None)
        return f"the forward of {type(root).__name__}" if root is not None else outside

    def trusted(self) -> "Trusted":
        """A context within which chainer's functions run unguarded."""
        return Trusted(self)


class Trusted:
    """Within it, chainer's functions run unguarded: a package's code that does its own
    collectives and marks."""

    def __init__(self, state: Marks[Any, Any]) -> None:
        self._state = state

    def __enter__(self) -> None:
        self._state.depth += 1

    def __exit__(self, *exc: Any) -> None:
        self._state.depth -= 1


def _same(a: Any) -> Any:
    return a
