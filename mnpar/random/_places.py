"""Which call of the model a draw is: its *place*, the same in one process and in every split.

A place names the innermost link (by its path in the model the scope was
given) or the innermost layer of a ``chainer.Sequential`` (its index) that
the draw happens in, which call of that link this is in the forward, and
which draw inside that call::

    /block3/attn#0:1      the 2nd draw in the 1st call of link /block3/attn
    /predictor[4]#0:0     the 1st draw in layer 4 (a function) of the Sequential
                          /predictor, in its 1st call

Every split runs the same links with the same paths, so a pipeline stage,
a tile or a replica names the place one process names. A stage's part of a
cut Sequential is an *alias* of the whole (``alias``), and runs its layers
with their indices in the whole.

The place is read from the Python call stack when a draw happens (the
frames of ``Link.__call__`` and of ``call_layer``), so an exception that
unwinds a forward leaves nothing stale behind. Call counts are kept by a
``LinkHook`` that notes each call of a link, and start again with each
outermost call (a forward of the model, a stage or a recomputation).
"""
import sys
import types
import weakref
from typing import Any, Dict, Iterable, Optional, Tuple

import chainer

CALL = chainer.Link.__call__.__code__
_aliases: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def alias(link: chainer.Link, whole: chainer.Link) -> None:
    """Draws in ``link`` (a stage's part of the Sequential ``whole``) are named as in ``whole``."""
    _aliases[link] = whole


def call_layer(owner: Any, index: int, layer: Any, x: Any) -> Any:
    """Layer ``index`` of the Sequential ``owner`` as chainer calls it (a tuple is unpacked
    into arguments); a draw inside it finds the layer by this frame."""
    return layer(*x) if isinstance(x, tuple) else layer(x)


LAYER = call_layer.__code__


def sequential_forward(self: Any, *x: Any) -> Any:
    """chainer.Sequential's forward, each layer called through ``call_layer``."""
    if not self._layers:
        raise RuntimeError("Sequential does not have any layer.")
    for index, layer in enumerate(self._layers):
        x = call_layer(self, index, layer, x)
    return x


def _outermost(frame: Optional[types.FrameType]) -> bool:
    """No call of a link encloses ``frame``."""
    while frame is not None:
        if frame.f_code is CALL:
            return False
        frame = frame.f_back
    return True


class Places(chainer.LinkHook):
    """Names draws by place; counts the calls of links in each forward.

    Args:
        roots: name -> link; the links under them are named by their paths,
            after the root's name (``''`` for a single model).
    """

    name = "mnpar.random.places"

    def __init__(self, roots: Dict[str, chainer.Link]) -> None:
        self.roots = dict(roots)
        self._names: Dict[int, str] = {}
        self._calls: Dict[int, int] = {}  # id(link) -> its calls so far in this forward
        self._open: Dict[int, Tuple[int, int]] = {}  # id(call frame) -> (serial, call)
        self._draws: Dict[Tuple[int, Any], int] = {}  # (serial, layer) -> draws so far
        self._serial = 0
        self.forward = 0  # outermost calls so far
        self._learn()

    def _learn(self) -> None:
        names: Dict[int, str] = {}
        for root, link in self.roots.items():
            for path, sub in link.namedlinks():
                names.setdefault(id(sub), root + path if path != "/" else (root or "/"))
        self._names = names

    def forward_preprocess(self, args: Any) -> None:
        frame = sys._getframe(1)  # Link.__call__ of args.link
        if _outermost(frame.f_back):
            self.forward += 1
            self._calls.clear()
            self._open.clear()
            self._draws.clear()
        key = id(args.link)
        call = self._calls.get(key, 0)
        self._calls[key] = call + 1
        self._serial += 1
        self._open[id(frame)] = (self._serial, call)

    def path(self, link: Any) -> Optional[str]:
        """The path of ``link`` (or of the whole a part is an alias of), or None."""
        link = _aliases.get(link, link)
        name = self._names.get(id(link))
        if name is None and isinstance(link, chainer.Link):
            self._learn()  # a link added since
            name = self._names.get(id(link))
        return name

    def place(self, what: str) -> str:
        """The place of a draw made now (by ``what``).

        Raises:
            ValueError: the draw is outside every link the scope names.
        """
        frame: Optional[types.FrameType] = sys._getframe(1)
        layer: Optional[Tuple[Any, int, str]] = None  # (owner, index, owner's path)
        while frame is not None:
            code = frame.f_code
            if code is LAYER and layer is None:
                owner = frame.f_locals["owner"]
                path = self.path(owner)
                if path is not None:
                    layer = (owner, frame.f_locals["index"], path)
            elif code is CALL:
                link = frame.f_locals["self"]
                if layer is not None and link is layer[0]:
                    return self._name(frame, f"{layer[2]}[{layer[1]}]", layer[1], what)
                if layer is None:
                    path = self.path(link)
                    if path is not None:
                        return self._name(frame, path, None, what)
            frame = frame.f_back
        raise ValueError(
            f"mnpar.random.scope: {what} draws outside the links the scope names; call it "
            "inside the model given to mnpar.random.scope (or name the link that calls it: "
            "scope({name: link, ...}))")

    def _name(self, frame: types.FrameType, path: str, layer: Optional[int], what: str) -> str:
        opened = self._open.get(id(frame))
        if opened is None:
            raise ValueError(f"mnpar.random.scope: {what} draws in a call of {path} that began "
                             "before the scope was entered; enter the scope outside the forward")
        serial, call = opened
        draw = self._draws.get((serial, layer), 0)
        self._draws[(serial, layer)] = draw + 1
        return f"{path}#{call}:{draw}"


def innermost_links() -> Iterable[Any]:
    """The links being called, innermost first."""
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None:
        if frame.f_code is CALL:
            yield frame.f_locals["self"]
        frame = frame.f_back


def inside(code: types.CodeType) -> bool:
    """A call of the function of ``code`` encloses the caller."""
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def holds_parameter(array: Any) -> bool:
    """``array`` is a parameter's array of the innermost link being called."""
    for link in innermost_links():
        return any(p.array is array for p in link.params(include_uninit=False))
    return False


def rnn_dropout() -> Optional[float]:
    """The ``dropout`` of the innermost link that has one (chainer's NStep RNN links);
    None where no link being called has one."""
    for link in innermost_links():
        ratio = getattr(link, "dropout", None)
        if isinstance(ratio, (int, float)):
            return float(ratio)
    return None
