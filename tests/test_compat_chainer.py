"""_mnpar_compat._chainer: chainer 7.8.1 on current numpy and Python 3.12+.

The checks of the hook itself run in a fresh interpreter, started as a user's
would be (the ``.pth`` start-up hook included), because the hook acts before
``import chainer``; the scan of chainer's sources and ``F.resize_images`` run
in this one, which started the same way.
"""
import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import warnings

import chainer
import chainer.functions as F
import chainer.gradient_check
import numpy as np
import pytest

from _mnpar_compat import _chainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLD_STACK = np.__version__.startswith("1.") and sys.version_info < (3, 12)
NUMPY2 = not np.__version__.startswith("1.")
STATE = """
import json, sys
hooked = [type(f).__name__ for f in sys.meta_path]
import chainer, numpy
import chainer.functions as F
from _mnpar_compat import _chainer
x = chainer.Variable(numpy.arange(6, dtype=numpy.float32))
y = F.as_strided(x, (2, 2), (1, 2))  # reads numpy.sctypes at import and in backward
F.sum(y).backward()
distutils = sys.modules.get("numpy.distutils.system_info")
print(json.dumps({
    "hooked": hooked, "applied": _chainer.applied, "grad": x.grad.tolist(),
    "loader": type(chainer.__loader__).__name__,
    "spec_loader": type(chainer.__spec__.loader).__name__,
    "distutils": getattr(distutils, "__file__", repr(distutils)),
    "modules": sorted(sys.modules), "numpy": sorted(dir(numpy)),
    "sctypes": {k: [t.__name__ for t in v] for k, v in eval(
        "numpy.sctypes", {"__name__": "chainer.probe", "numpy": numpy}).items()},
    "finders": [type(f).__name__ for f in sys.meta_path]}))
"""
# numpy 1.26's own table, which chainer's as_strided reads.
SCTYPES = {"int": ["int8", "int16", "int32", "int64"],
           "uint": ["uint8", "uint16", "uint32", "uint64"],
           "float": ["float16", "float32", "float64", "longdouble"],
           "complex": ["complex64", "complex128", "clongdouble"],
           "others": ["bool", "object", "bytes", "str", "void"]}


def python(code, check=True, **env):
    """Runs ``code`` in a fresh interpreter of this environment; returns the process."""
    environ = {**os.environ, **env}
    proc = subprocess.run([sys.executable, "-c", code], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def state(**env):
    return json.loads(python(STATE, **env).stdout)


def test_start_up_hook_waits_for_chainer_in_front_of_the_import_system():
    found = state()
    assert found["hooked"][0] == "ChainerFinder"  # installed by mnpar-compat.pth
    assert "ChainerFinder" not in found["finders"]  # gone once chainer imported
    assert found["loader"] == found["spec_loader"] == "SourceFileLoader"  # chainer's own
    assert found["grad"] == [1, 1, 1, 1, 0, 0]


SERVED = "numpy's removed names, for chainer's code"
NUMPY_LACKS_FLOAT = not np.__version__.startswith(("1.21", "1.22", "1.23"))
# What user code sees of numpy: every removed name (value or error and its
# warnings, with where they point), a few that numpy itself warns about, and
# that no name of mnpar's entered numpy's namespace.
USER_VIEW = """
import json, os, warnings
if os.environ.get("IMPORT_CHAINER"):
    import chainer, chainer.functions
import numpy
from _mnpar_compat import _chainer
found = {"mnpar's names in numpy": [k for k in vars(numpy) if "mnpar" in k]}
for name in sorted(_chainer.REMOVED) + ["bool8", "chararray", "no_such_name"]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = getattr(numpy, name)
            found[name] = getattr(value, "__qualname__", None) or repr(value)
        except AttributeError as e:
            found[name] = "AttributeError: " + str(e)
    found[name + " warnings"] = [(w.category.__name__, str(w.message), w.filename, w.lineno)
                                 for w in caught]
code = numpy.__getattr__.__code__
found["__getattr__"] = [code.co_filename, code.co_firstlineno]
print(json.dumps(found))
"""


def test_patches_what_this_stack_lacks_and_only_that():
    found = state()
    wanted = [SERVED] if NUMPY_LACKS_FLOAT else []
    if sys.version_info >= (3, 12):
        wanted.append("numpy.distutils.system_info")
    assert found["applied"] == wanted
    assert found["sctypes"] == SCTYPES  # served to chainer (numpy 1's own table on numpy 1)
    if "numpy.distutils.system_info" in wanted:
        # The stub served chainer's __init__ and is gone again.
        assert found["distutils"] == "None"
        assert not any(m.startswith("numpy.distutils") for m in found["modules"])
    else:
        assert found["distutils"].endswith(os.path.join("numpy", "distutils", "system_info.py"))


@pytest.mark.skipif(not NUMPY_LACKS_FLOAT, reason="numpy 1.24 or later only")
def test_user_code_sees_numpy_as_it_is():
    # With chainer imported through the hook, and without the hook or chainer at all.
    on = json.loads(python(USER_VIEW, IMPORT_CHAINER="1").stdout)
    off = json.loads(python(USER_VIEW, MNPAR_CHAINER_COMPAT="0").stdout)
    assert on.keys() == off.keys()
    for key in on:
        assert on[key] == off[key], key
    assert on["float"].startswith("AttributeError: module 'numpy' has no attribute 'float'")
    if not NUMPY2:  # numpy's own warning still points at the line that asked
        assert [w[0] for w in on["bool8 warnings"]] == ["DeprecationWarning"]
        assert on["bool8 warnings"][0][2] == "<string>"


def test_without_it_chainer_fails():
    if OLD_STACK:
        code = ("import numpy, chainer.functions as F\n"
                "F.resize_images(numpy.ones((1, 1, 2, 2), numpy.float32), (3, 3))")
    else:
        code = "import chainer"
    proc = python(code, check=False, MNPAR_CHAINER_COMPAT="0")
    assert proc.returncode != 0
    assert re.search(r"numpy' has no attribute 'float'|np\.sctypes|numpy\.distutils", proc.stderr)
    python(code)  # and with it, it runs


def test_every_patch_names_the_chainer_lines_that_need_it():
    root = os.path.dirname(os.path.dirname(chainer.__file__))
    for patch in _chainer.PATCHES:
        clauses = re.findall(r"(chainer/\S+\.py):(\d+) ((?:numpy|np)(?:\.\w+)+)", patch.why)
        assert clauses, patch
        for path, line, name in clauses:
            with open(os.path.join(root, path)) as f:
                assert name in f.read().splitlines()[int(line) - 1], (patch.name, path, line)


# -- every name numpy removed that chainer uses, found in chainer's sources --------


def chainer_sources():
    """The .py files of chainer's distribution whose code is served (``CLIENTS``)."""
    files = importlib.metadata.files("chainer") or []
    found = [f.locate() for f in files
             if f.suffix == ".py" and f.parts[0] in _chainer.CLIENTS]
    assert any(str(f).endswith(os.path.join("chainer", "functions", "array",
                                            "resize_images.py")) for f in found)
    return found


def numpy_names_used(paths):
    """``{name: ["path:line", ...]}`` for every ``numpy.X``, ``np.X``, ``xp.X`` and
    ``from numpy import X`` in the files."""
    used = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), str(path))
        for node in ast.walk(tree):
            names = []
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in ("numpy", "np", "xp")):
                names = [node.attr]
            elif isinstance(node, ast.ImportFrom) and node.module == "numpy" and not node.level:
                names = [alias.name for alias in node.names]
            for name in names:
                used.setdefault(name, []).append(f"{path}:{node.lineno}")
    return used


def numpy_has(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy 1.26 warns about np.long even when asked
        return hasattr(np, name) or importlib.util.find_spec(f"numpy.{name}") is not None


def as_chainer(expression):
    """``expression`` evaluated by code of chainer's (its module name is chainer's)."""
    return eval(expression, {"__name__": "chainer.functions.probe", "numpy": np})


def test_every_removed_numpy_name_chainer_uses_resolves_for_chainer():
    used = numpy_names_used(chainer_sources())
    assert len(used) > 100  # the scan sees chainer's numpy
    missing = {name: where for name, where in used.items() if not numpy_has(name)}
    if NUMPY_LACKS_FLOAT:
        assert "float" in missing  # F.resize_images: the scan finds what numpy removed
    if NUMPY2:
        assert "sctypes" in missing
    for name, where in sorted(missing.items()):
        if name == "distutils":  # only at chainer's import: the stub patch's job
            assert all("_environment_check.py" in w for w in where), where
            continue
        assert name in _chainer.REMOVED, (name, where)
        assert as_chainer(f"numpy.{name}") is not None, (name, where)
        with pytest.raises(AttributeError):
            getattr(np, name)  # user code: numpy as it is


def test_served_names_are_what_numpy_had():
    assert as_chainer("numpy.float") is float and as_chainer("numpy.int") is int
    if not NUMPY2:  # numpy 2 has np.long again: C's long, its own
        assert as_chainer("numpy.long") is int
    assert as_chainer("numpy.unicode") is str and as_chainer("numpy.object") is object
    assert as_chainer("numpy.sctypes")["float"][-1] is np.longdouble
    assert as_chainer("numpy.Inf") == np.inf and as_chainer("numpy.NZERO") == 0.0
    assert np.signbit(as_chainer("numpy.NZERO"))
    for old in ("float_", "complex_", "string_", "unicode_", "round_", "sometrue"):
        if not NUMPY2:
            assert as_chainer(f"numpy.{old}") is getattr(np, old)  # numpy 1 still has it


# -- F.resize_images (numpy.float) against a NumPy reference ------------------------


def resized(x, out_h, out_w, mode, align_corners):
    """Each output pixel from the source pixels around it, written out one by one."""
    _, _, h, w = x.shape
    out = np.empty(x.shape[:2] + (out_h, out_w))

    def source(i, n_in, n_out):
        if mode == "nearest":
            return min(int(np.floor(i * n_in / n_out)), n_in - 1), 0.0
        if align_corners:
            at = i * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            at = max((i + 0.5) * n_in / n_out - 0.5, 0.0)
        return int(np.floor(at)), at - np.floor(at)

    for i in range(out_h):
        y, wy = source(i, h, out_h)
        for j in range(out_w):
            x0, wx = source(j, w, out_w)
            y1, x1 = min(y + 1, h - 1), min(x0 + 1, w - 1)
            out[:, :, i, j] = ((1 - wy) * ((1 - wx) * x[:, :, y, x0] + wx * x[:, :, y, x1])
                               + wy * ((1 - wx) * x[:, :, y1, x0] + wx * x[:, :, y1, x1]))
    return out


@pytest.mark.parametrize("mode, align_corners", [("bilinear", True), ("bilinear", False),
                                                 ("nearest", False)])
@pytest.mark.parametrize("size", [(7, 5), (2, 3)])
def test_resize_images_matches_a_numpy_reference(mode, align_corners, size):
    x = np.random.RandomState(0).randn(2, 3, 4, 3).astype(np.float32)  # its only dtype
    y = F.resize_images(x, size, mode=mode, align_corners=align_corners)
    np.testing.assert_allclose(y.array, resized(x.astype(np.float64), *size, mode,
                                                align_corners), rtol=1e-6, atol=1e-6)
    gy = np.random.RandomState(1).randn(*y.shape).astype(np.float32)
    chainer.gradient_check.check_backward(  # linear in x: the numerical gradient is exact
        lambda a: F.resize_images(a, size, mode=mode, align_corners=align_corners), x, gy,
        eps=0.5, atol=1e-4, rtol=1e-4)


def test_report_lists_the_patches_and_the_openblas_kernels():
    out = python("import runpy; runpy.run_module('_mnpar_compat', run_name='__main__')").stdout
    assert f"numpy {np.__version__}, chainer 7.8.1" in out
    assert "chainer patches applied: " in out and "runs " in out and " kernels: " in out


@pytest.mark.slow
@pytest.mark.reference
@pytest.mark.skipif(not NUMPY2, reason="the numpy 2 suite compares with numpy 1.26")
@pytest.mark.skipif(not os.environ.get("MNPAR_REFERENCE_PYTHON"),
                    reason="MNPAR_REFERENCE_PYTHON (a numpy 1.26 interpreter) is not set; "
                           "`make test NUMPY=2` sets it")
def test_training_losses_on_numpy_2_equal_numpy_1s(tmp_path):
    reference = os.environ["MNPAR_REFERENCE_PYTHON"]
    script = os.path.join(ROOT, "tests", "scripts", "numpy_losses.py")
    runs = {}
    for name, interpreter in (("numpy2", sys.executable), ("numpy1", reference)):
        out = subprocess.run([interpreter, script, str(tmp_path / name)], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        runs[name] = json.loads(out.stdout)
    new, old = runs["numpy2"], runs["numpy1"]
    assert old.pop("numpy").startswith("1.") and not new.pop("numpy").startswith("1.")
    assert sorted(new) == sorted(old) == ["cnn", "lstm", "mlp", "pipeline", "resumed",
                                          "seq2seq", "trainer"]
    for name in old:
        # numpy 2 keeps float32 means in float32 (NEP 50): equal to float32 precision.
        assert np.allclose(new[name], old[name], rtol=1e-6, atol=0), name
    assert new["resumed"] == new["trainer"]
