"""chainer 7.8.1 on current numpy and Python 3.12+: patches applied as chainer imports.

chainer 7.8.1 is the last chainer. A few of its lines use names that numpy
removed (``numpy.float`` in ``F.resize_images``, gone in numpy 1.24;
``numpy.sctypes`` in ``F.as_strided``, gone in 2.0), and one imports
``numpy.distutils``, which numpy 2 and Python 3.12 dropped. This module fills
exactly those gaps:

* a finder at the front of ``sys.meta_path`` waits for ``import chainer``;
  until then it costs nothing and touches nothing, not even numpy;
* when chainer starts to import, each patch whose name is missing is applied;
* a patch needed only while chainer's ``__init__`` runs is undone when it ends.

**Removed names, for chainer's code only.** numpy's module ``__getattr__``
(which runs only when a name is not in numpy's namespace) gets one statement
in front: if the name is one numpy removed (``REMOVED``: the aliases of 1.24
and 2.0, with what each meant) and the code asking belongs to chainer's
packages (``CLIENTS``, by the asking frame's module name), it returns the old
value. Anyone else gets numpy's own answer: the same ``AttributeError`` and
message, the same warnings. Why this way:

* ``numpy.float = float`` would be visible to every user: code that numpy
  rejects would run here and fail elsewhere, and libraries that probe numpy
  (``hasattr(numpy, "float")``) would change their paths.
* a wrapper around numpy's ``__getattr__`` would sit between numpy and the
  caller, so numpy's own deprecation warnings (``stacklevel=2``) would point
  at the wrapper and, from ``__main__``, be hidden. So the statement is
  spliced into numpy's function itself, recompiled from numpy's source with
  its own file name and line numbers (``_spliced``); only where that source
  cannot be read does a wrapper stand in.
* a ``ModuleType`` subclass as numpy's ``__class__`` makes every numpy
  attribute read three times slower (Python 3.11), and rewriting chainer's
  sources costs 55 ms per ``import chainer`` to find the lines.

A normal numpy attribute read never reaches ``__getattr__``: nothing is
slower. What a user can see: ``numpy.__getattr__`` is a new function (same
code, file and lines, one keyword-only argument more).
``tests/test_compat_chainer.py`` parses chainer's sources for every
``numpy.X``/``np.X``/``xp.X`` and checks that each resolves for chainer.

Each patch names, in ``why``, the chainer lines that need it.
"""
import contextlib
import importlib
import importlib.util
import sys
import types
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Set, cast


class Patch(NamedTuple):
    name: str
    why: str  # "path:line name (...)" clauses, "; " apart: the chainer lines that need it
    needed: Callable[[], bool]
    apply: Callable[[], Optional[Callable[[], None]]]  # returns an undo, or None to keep it


applied: List[str] = []  # names of the patches applied in this process
served: Set[str] = set()  # removed names served to chainer so far in this process

# The packages of chainer's distribution whose code gets the removed names.
# (chainerx imports a few at start, only where it was built with
# CHAINER_BUILD_CHAINERX, which no pip install of chainer 7.8.1 does.)
CLIENTS = frozenset({"chainer", "chainermn", "onnx_chainer"})

# numpy 1.24 removed the aliases of Python's own types (deprecated in 1.20).
_BUILTINS: Dict[str, Any] = {"bool": bool, "int": int, "float": float, "complex": complex,
                             "object": object, "str": str, "long": int, "unicode": str}
# numpy 2.0 removed these aliases of names it kept (NEP 52).
_RENAMED = {"float_": "float64", "complex_": "complex128", "cfloat": "complex128",
            "singlecomplex": "complex64", "longfloat": "longdouble",
            "clongfloat": "clongdouble", "longcomplex": "clongdouble", "string_": "bytes_",
            "unicode_": "str_", "Inf": "inf", "Infinity": "inf", "infty": "inf",
            "PINF": "inf", "NaN": "nan", "NAN": "nan", "round_": "round", "product": "prod",
            "cumproduct": "cumprod", "sometrue": "any", "alltrue": "all"}
_VALUES: Dict[str, Any] = {"NINF": float("-inf"), "PZERO": 0.0, "NZERO": -0.0}
REMOVED = frozenset(_BUILTINS) | frozenset(_RENAMED) | frozenset(_VALUES) | {"sctypes"}


def _numpy() -> Any:
    """numpy, typed loosely: these names exist in one numpy and not in the other."""
    return importlib.import_module("numpy")


def old_value(name: str) -> Any:
    """What numpy's removed ``name`` was."""
    if name in _BUILTINS:
        return _BUILTINS[name]
    if name in _VALUES:
        return _VALUES[name]
    numpy = _numpy()
    if name == "sctypes":
        return _sctypes(numpy)
    return getattr(numpy, _RENAMED[name])


def _sctypes(numpy: Any) -> Dict[str, list]:
    # numpy 1.26's table, built from the scalar types numpy 2 still has.
    return {
        "int": [numpy.int8, numpy.int16, numpy.int32, numpy.int64],
        "uint": [numpy.uint8, numpy.uint16, numpy.uint32, numpy.uint64],
        "float": [numpy.float16, numpy.float32, numpy.float64, numpy.longdouble],
        "complex": [numpy.complex64, numpy.complex128, numpy.clongdouble],
        "others": [bool, object, bytes, str, numpy.void],
    }


class _Served:
    """Asked by numpy's ``__getattr__`` about a name numpy lacks: its old value if
    chainer's code asks for it, else this object itself (serve nothing)."""

    def __contains__(self, name: str) -> bool:
        return name in REMOVED

    def __call__(self, name: str) -> Any:
        # Frame 1 is numpy's __getattr__, frame 2 the code that read the name.
        module = sys._getframe(2).f_globals.get("__name__") or ""
        if module.partition(".")[0] not in CLIENTS:
            return self
        served.add(name)
        return old_value(name)


SERVED = _Served()
_GUARD = """\
if {name} in __mnpar_served__:
    __mnpar_value__ = __mnpar_served__({name})
    if __mnpar_value__ is not __mnpar_served__:
        return __mnpar_value__
"""


def _spliced(numpy: Any, original: Any) -> bool:
    """Puts ``_GUARD`` in front of numpy's own ``__getattr__``, recompiled from its
    source in numpy's namespace, with numpy's file name and line numbers; False where
    the source cannot be read or does not look as expected."""
    import ast  # here, not at start: every interpreter imports this module
    import inspect
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(original))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return False
    func = tree.body[0] if len(tree.body) == 1 else None
    if (not isinstance(func, ast.FunctionDef) or func.decorator_list
            or len(func.args.args) != 1 or func.args.vararg or func.args.kwarg):
        return False
    ast.increment_lineno(tree, original.__code__.co_firstlineno - 1)
    guard = ast.parse(_GUARD.format(name=func.args.args[0].arg)).body
    first = func.body[0]
    for statement in guard:
        for node in ast.walk(statement):  # on the body's first line: tracebacks keep theirs
            ast.copy_location(node, first)
    func.body[:0] = guard
    # The server is a keyword-only argument's default: no new name in numpy's namespace.
    func.args.kwonlyargs.append(ast.arg(arg="__mnpar_served__"))
    func.args.kw_defaults.append(ast.Constant(value=None))
    ast.fix_missing_locations(tree)
    code = compile(tree, original.__code__.co_filename, "exec")
    namespace = vars(numpy)
    exec(code, namespace)  # defines __getattr__ in numpy's namespace, as numpy did
    namespace["__getattr__"].__kwdefaults__ = {"__mnpar_served__": SERVED}
    return True


def _wrapped(numpy: Any, original: Optional[Callable[[str], Any]]) -> Callable[[str], Any]:
    """The stand-in where numpy's source cannot be spliced (numpy's warnings then
    point one frame too low)."""
    def __getattr__(name: str) -> Any:
        if name in SERVED:
            value = SERVED(name)
            if value is not SERVED:
                return value
        if original is None:
            raise AttributeError(f"module 'numpy' has no attribute {name!r}")
        return original(name)
    return __getattr__


def _names_missing() -> bool:
    numpy = _numpy()
    return any(name not in vars(numpy) for name in ("float", "sctypes"))


def _serve_removed_names() -> None:
    numpy = _numpy()
    original = vars(numpy).get("__getattr__")
    if original is None or not _spliced(numpy, original):
        numpy.__getattr__ = _wrapped(numpy, original)


def _distutils_missing() -> bool:
    # Looked up, not imported: on numpy 1 and Python 3.11 chainer imports it itself.
    return importlib.util.find_spec("numpy.distutils") is None


def _stub_distutils() -> Callable[[], None]:
    numpy = _numpy()

    package = types.ModuleType("numpy.distutils", "Stub installed by mnpar while chainer imports.")
    package.__path__ = []
    system_info: Any = types.ModuleType("numpy.distutils.system_info", package.__doc__)
    system_info.get_info = lambda name, notfound_action=0: {}
    package.system_info = system_info  # type: ignore[attr-defined]
    sys.modules["numpy.distutils"] = package
    sys.modules["numpy.distutils.system_info"] = system_info

    def undo() -> None:
        for name, stub in (("numpy.distutils.system_info", system_info),
                           ("numpy.distutils", package)):
            if sys.modules.get(name) is stub:
                del sys.modules[name]
        if getattr(numpy, "distutils", None) is package:
            del numpy.distutils

    return undo


PATCHES = (
    Patch("numpy's removed names, for chainer's code",
          "chainer/functions/array/resize_images.py:179 numpy.float (gone in numpy 1.24); "
          "chainer/functions/array/as_strided.py:10 np.sctypes (gone in numpy 2, also "
          ":252); tests/test_compat_chainer.py finds every other",
          _names_missing, _serve_removed_names),
    Patch("numpy.distutils.system_info",
          "chainer/_environment_check.py:6 numpy.distutils.system_info (gone in numpy 2 and "
          "Python 3.12)",
          _distutils_missing, _stub_distutils),
)


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Applies the missing patches; undoes those needed only inside the block."""
    undo = []
    for patch in PATCHES:
        if patch.needed():
            then = patch.apply()
            applied.append(patch.name)
            if then is not None:
                undo.append(then)
    try:
        yield
    finally:
        for then in reversed(undo):
            then()


class _Loader:
    """chainer's own loader, run with the patches applied (not an importlib.abc
    subclass: importing importlib.abc would cost every interpreter 10 ms at start)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        with patched():
            self.loader.exec_module(module)


class ChainerFinder:
    """Waits for ``import chainer``; then leaves sys.meta_path."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "chainer":
            return None
        uninstall()
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = cast(Any, _Loader(spec.loader))
        return spec


def install() -> None:
    """Puts the finder in front of sys.meta_path, unless chainer is already imported."""
    if "chainer" in sys.modules or any(isinstance(f, ChainerFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, ChainerFinder())


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, ChainerFinder)]
