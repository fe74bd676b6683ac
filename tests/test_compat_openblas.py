"""_mnpar_compat._openblas: the right OPENBLAS_CORETYPE at start, never the user's overridden.

Fresh interpreters show what the start-up hook did: it must act before numpy
loads. A cache seeded with "the library detects Prescott" plays the Intel VMs
whose CPU numpy 1.26's OpenBLAS does not know, on any CPU with AVX-512.
"""
import json
import os
import subprocess
import sys

import numpy  # noqa: F401 - loads the OpenBLAS this process runs
import pytest
from threadpoolctl import threadpool_info

from _mnpar_compat import _openblas

INFO = _openblas.cpu()
FLAGS = frozenset(INFO["flags"].split()) if INFO else frozenset()
LIBRARY = _openblas.numpy_openblas()
ARCHITECTURE = """
import json, os
import numpy
from threadpoolctl import threadpool_info
from _mnpar_compat import _openblas
library = os.path.realpath(_openblas.numpy_openblas())
print(json.dumps({"variable": os.environ.get("OPENBLAS_CORETYPE"), "decision": _openblas.decision,
                  "cores": [p["architecture"] for p in threadpool_info()
                            if os.path.realpath(p["filepath"]) == library]}))
"""
needs_library = pytest.mark.skipif(LIBRARY is None or INFO is None,
                                   reason="needs numpy's bundled OpenBLAS on Linux")
needs_avx512 = pytest.mark.skipif(not _openblas.AVX512 <= FLAGS, reason="needs AVX-512")


def started(cache, **env):
    """What a fresh interpreter's OpenBLAS runs, with this cache and environment."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("OPENBLAS_CORETYPE", _openblas.SWITCH)}
    environ.update(MNPAR_CACHE_DIR=str(cache), **env)
    out = subprocess.run([sys.executable, "-c", ARCHITECTURE], env=environ, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def seed(cache, detected, choice):
    """A cache that says numpy's OpenBLAS detects ``detected`` on this CPU."""
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, "openblas-coretype.json"), "w") as f:
        json.dump({_openblas.identity(LIBRARY, INFO): {"detected": detected, "choice": choice}},
                  f)


@pytest.mark.parametrize("flags, wanted", [
    ({"sse2", "avx", "avx2", "fma", *_openblas.AVX512, "avx512_bf16"}, ["SkylakeX", "Haswell"]),
    ({"sse2", "avx", "avx2", "fma"}, ["Haswell"]),
    ({"sse2", "avx", "avx2"}, []),  # no FMA: Haswell's kernels would not run
    ({"sse2", "avx", "avx512f"}, []),  # AVX-512 foundation alone is not SkylakeX
])
def test_candidates_follow_the_cpu_flags(flags, wanted):
    assert _openblas.candidates(frozenset(flags)) == wanted


@pytest.mark.parametrize("detected, accepted, choice", [
    ("Prescott", {"SkylakeX", "Haswell"}, "SkylakeX"),
    ("Katmai", {"Haswell"}, "Haswell"),  # numpy 2's OpenBLAS names its generic core Katmai
    ("Prescott", set(), None),  # the library ignores both names: leave it
    ("Haswell", {"SkylakeX", "Haswell"}, None),  # not generic: the library knows best
])
def test_choose_sets_a_core_only_over_a_generic_one_and_only_one_the_library_takes(
        monkeypatch, detected, accepted, choice):
    def probe(library, coretype=None):
        return detected if coretype is None or coretype not in accepted else coretype

    monkeypatch.setattr(_openblas, "probe", probe)
    found = _openblas.choose("lib", frozenset({"avx2", "fma", *_openblas.AVX512}))
    assert found == {"detected": detected, "choice": choice}


@needs_library
def test_probe_reports_what_numpy_runs(tmp_path):
    plain = started(tmp_path, MNPAR_OPENBLAS_CORETYPE="0")
    assert plain["variable"] is None and plain["decision"] == {}
    assert [_openblas.probe(LIBRARY)] == plain["cores"]
    assert _openblas.probe(LIBRARY, "Haswell") == "Haswell"
    # A name the library lacks is not taken (choose relies on it): it runs a core of its
    # own choosing, which is not always the one it detects (Haswell, not Zen, on an EPYC).
    assert _openblas.probe(LIBRARY, "NoSuchCore") not in (None, "NoSuchCore")


@needs_library
@pytest.mark.skipif(not _openblas.candidates(FLAGS), reason="needs AVX2 with FMA or AVX-512")
def test_a_cpu_with_avx2_or_avx512_never_runs_generic_kernels(tmp_path):
    found = started(tmp_path / "fresh")
    assert found["cores"] and found["cores"][0] not in _openblas.GENERIC, found
    with open(tmp_path / "fresh" / "openblas-coretype.json") as f:
        assert found["decision"]["detected"] in json.dumps(json.load(f))  # probed once, kept


@needs_library
@needs_avx512
def test_where_the_library_would_run_generic_kernels_the_hook_sets_skylakex(tmp_path):
    seed(tmp_path, "Prescott", "SkylakeX")
    found = started(tmp_path)
    assert found["variable"] == "SkylakeX" and found["cores"] == ["SkylakeX"]


@needs_library
@needs_avx512
def test_the_users_choice_wins(tmp_path):
    seed(tmp_path, "Prescott", "SkylakeX")
    found = started(tmp_path, OPENBLAS_CORETYPE="Haswell")
    assert found["variable"] == "Haswell" and found["cores"] == ["Haswell"]
    assert found["decision"] == {}
    found = started(tmp_path, MNPAR_OPENBLAS_CORETYPE="0")
    assert found["variable"] is None and found["cores"] == [_openblas.probe(LIBRARY)]


def test_the_hook_does_nothing_once_numpy_is_loaded(monkeypatch):
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.delenv(_openblas.SWITCH, raising=False)
    monkeypatch.setattr(_openblas, "probe", lambda *a: pytest.fail("probed too late"))
    assert "numpy" in sys.modules
    _openblas.install()
    assert "OPENBLAS_CORETYPE" not in os.environ


@needs_library
@pytest.mark.skipif(not _openblas.decision, reason="the start-up hook had nothing to decide here")
def test_this_process_runs_what_its_start_up_hook_chose():
    cores = [p["architecture"] for p in threadpool_info()  # numpy's; scipy may bring its own
             if os.path.realpath(p["filepath"]) == os.path.realpath(LIBRARY)]
    if _openblas.decision.get("choice"):
        assert cores == [_openblas.decision["choice"]]
    else:
        assert cores == [_openblas.decision["detected"]]


def test_every_answer_is_probed_once_a_failure_too(monkeypatch, tmp_path):
    # A probe that fails (no loadable library, an odd sys.executable) must not
    # cost every later interpreter start another child interpreter.
    calls = []
    monkeypatch.setenv("MNPAR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_openblas, "probe", lambda *a: calls.append(a))
    first = _openblas._remembered("key", "lib", frozenset({"avx2", "fma"}))
    assert first == {"detected": None, "choice": None} and len(calls) == 1
    assert _openblas._remembered("key", "lib", frozenset({"avx2", "fma"})) == first
    assert len(calls) == 1
