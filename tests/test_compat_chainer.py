"""_mnpar_compat._chainer: chainer 7.8.1 on numpy 2 and Python 3.12+, a no-op elsewhere.

Every check runs in a fresh interpreter, started as a user's would be (the
``.pth`` start-up hook included), because the hook acts before ``import chainer``.
"""
import json
import os
import subprocess
import sys

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
    "sctypes": {k: [t.__name__ for t in v] for k, v in numpy.sctypes.items()},
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


@pytest.mark.skipif(not OLD_STACK, reason="numpy 1 and Python 3.11 only")
def test_is_a_no_op_on_numpy_1_and_python_3_11():
    on, off = state(), state(MNPAR_CHAINER_COMPAT="0")
    assert on["applied"] == [] and off["hooked"][0] != "ChainerFinder"
    assert on["distutils"].endswith(os.path.join("numpy", "distutils", "system_info.py"))
    for key in ("distutils", "modules", "numpy", "sctypes", "grad", "loader"):
        assert on[key] == off[key], key


@pytest.mark.skipif(OLD_STACK, reason="numpy 2 or Python 3.12+ only")
def test_patches_what_numpy_2_and_python_3_12_removed_and_only_that():
    found = state()
    wanted = ["numpy.sctypes"] if NUMPY2 else []
    if sys.version_info >= (3, 12):
        wanted.append("numpy.distutils.system_info")
    assert found["applied"] == wanted
    if NUMPY2:
        assert found["sctypes"] == SCTYPES
    if "numpy.distutils.system_info" in wanted:
        # The stub served chainer's __init__ and is gone again.
        assert found["distutils"] == "None"
        assert not any(m.startswith("numpy.distutils") for m in found["modules"])


@pytest.mark.skipif(OLD_STACK, reason="numpy 2 or Python 3.12+ only")
def test_without_it_chainer_does_not_import():
    proc = python("import chainer", check=False, MNPAR_CHAINER_COMPAT="0")
    assert proc.returncode != 0
    assert "sctypes" in proc.stderr or "numpy.distutils" in proc.stderr


def test_every_patch_names_the_chainer_line_that_needs_it():
    import chainer

    root = os.path.dirname(os.path.dirname(chainer.__file__))
    for patch in _chainer.PATCHES:
        path, line = patch.why.split()[0].split(":")
        with open(os.path.join(root, path)) as f:
            assert patch.name.split(".")[-1] in f.read().splitlines()[int(line) - 1], patch


def test_report_lists_the_patches_and_the_openblas_kernels():
    out = python("import runpy; runpy.run_module('_mnpar_compat', run_name='__main__')").stdout
    assert f"numpy {np.__version__}, chainer 7.8.1" in out
    assert "chainer patches applied: " in out and "runs " in out and " kernels: " in out


@pytest.mark.slow
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
