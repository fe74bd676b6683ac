"""chainer 7.8.1 on numpy 2 and Python 3.12+: patches applied as chainer imports.

chainer 7.8.1 is the last chainer. A few of its lines use numpy names that
numpy 2.0 removed, and one imports ``numpy.distutils``, which numpy 2 and
Python 3.12 dropped. This module fills exactly those gaps and nothing else:

* a finder at the front of ``sys.meta_path`` waits for ``import chainer``;
  until then it costs nothing and touches nothing, not even numpy;
* when chainer starts to import, each patch whose name is missing is applied
  (on numpy 1 and Python 3.11 none is: nothing changes there);
* a patch needed only while chainer's ``__init__`` runs is undone when it ends.

Each patch names, in ``why``, the chainer line that needs it.
"""
import contextlib
import importlib
import importlib.util
import sys
import types
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, cast


class Patch(NamedTuple):
    name: str
    why: str  # the chainer line that needs it
    needed: Callable[[], bool]
    apply: Callable[[], Optional[Callable[[], None]]]  # returns an undo, or None to keep it


applied: List[str] = []  # names of the patches applied in this process


def _numpy() -> Any:
    """numpy, typed loosely: these names exist in one numpy and not in the other."""
    return importlib.import_module("numpy")


def _sctypes_missing() -> bool:
    numpy = _numpy()
    try:
        numpy.sctypes  # noqa: B018
    except AttributeError:
        return True
    return False


def _restore_sctypes() -> None:
    numpy = _numpy()
    # numpy 1.26's table, built from the scalar types numpy 2 still has.
    numpy.sctypes = {
        "int": [numpy.int8, numpy.int16, numpy.int32, numpy.int64],
        "uint": [numpy.uint8, numpy.uint16, numpy.uint32, numpy.uint64],
        "float": [numpy.float16, numpy.float32, numpy.float64, numpy.longdouble],
        "complex": [numpy.complex64, numpy.complex128, numpy.clongdouble],
        "others": [bool, object, bytes, str, numpy.void],
    }


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
    Patch("numpy.sctypes",
          "chainer/functions/array/as_strided.py:10 and :252 read numpy.sctypes (gone in numpy 2)",
          _sctypes_missing, lambda: _restore_sctypes()),
    Patch("numpy.distutils.system_info",
          "chainer/_environment_check.py:6 imports numpy.distutils (gone in numpy 2, Python 3.12)",
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
