"""The right OPENBLAS_CORETYPE at interpreter start, where numpy's OpenBLAS guesses wrong.

numpy 1.26's wheels bundle OpenBLAS 0.3.23, which picks its kernels from a
table of CPU models. A newer CPU it does not know (the Intel Xeon VMs of
family 6 model 207, for one) gets the generic "Prescott" kernels: GEMM runs
at a sixth of its speed although the CPU has AVX-512. OpenBLAS reads
``OPENBLAS_CORETYPE`` once, when the library loads, so the choice must be
made before numpy is imported: at interpreter start, from mnpar's ``.pth``.

Asking the library is the only exact way to know what it will pick, and
loading it here would fix the choice too early; so a child interpreter loads
it and reports (``probe``), once per library and CPU, and the answer is kept
in a small cache file. The variable is set only when all of these hold:

* the user has not set ``OPENBLAS_CORETYPE`` (any value, even empty, wins),
  nor ``MNPAR_OPENBLAS_CORETYPE=0``, and numpy is not loaded yet;
* the bundled OpenBLAS reports a generic (SSE-only) core;
* the CPU's flags show AVX2 and FMA, or AVX-512, and the library accepts the
  matching core when asked for it.
"""
import glob
import importlib.util
import json
import os
import sys
from typing import Dict, List, Optional

VARIABLE = "OPENBLAS_CORETYPE"
SWITCH = "MNPAR_OPENBLAS_CORETYPE"
# OpenBLAS's x86 cores without AVX: what it falls back to on a CPU it does not know.
GENERIC = frozenset({"Unknown", "Katmai", "Coppermine", "Northwood", "Prescott", "Banias",
                     "Atom", "Core2", "Penryn", "Dunnington", "Nehalem", "Athlon", "Opteron",
                     "Opteron_SSE3", "Barcelona", "Nano", "Bobcat"})
AVX512 = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
# numpy's OpenBLAS finds its libgfortran through numpy, not its own RPATH: the
# probe loads the libraries beside it first, each once its own needs are met.
_PROBE = """\
import ctypes, glob, os, sys
others = [p for p in glob.glob(os.path.join(os.path.dirname(sys.argv[1]), "*.so*"))
          if p != sys.argv[1]]
for _ in range(len(others)):
    for path in list(others):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            others.remove(path)
        except OSError:
            pass
lib = ctypes.CDLL(sys.argv[1])
for name in ("openblas_get_corename64_", "openblas_get_corename",
             "scipy_openblas_get_corename64_", "scipy_openblas_get_corename"):
    if hasattr(lib, name):
        getattr(lib, name).restype = ctypes.c_char_p
        print(getattr(lib, name)().decode())
        break
"""

decision: Dict[str, Optional[str]] = {}  # what this process found and set, for reports


def candidates(flags: frozenset) -> List[str]:
    """The cores worth asking for on a CPU with these flags, best first."""
    if AVX512 <= flags:
        return ["SkylakeX", "Haswell"]
    if {"avx2", "fma"} <= flags:
        return ["Haswell"]
    return []


def cpu() -> Optional[Dict[str, str]]:
    """The model name and flags of the first CPU, from /proc/cpuinfo (Linux only)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        return None
    found: Dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("vendor_id", "cpu family", "model", "model name", "flags"):
            found.setdefault(key, value.strip())
        elif not line.strip() and found:
            break
    return found if "flags" in found else None


def numpy_openblas() -> Optional[str]:
    """The OpenBLAS bundled with numpy's wheel, found without importing numpy."""
    spec = importlib.util.find_spec("numpy")
    if spec is None or not spec.submodule_search_locations:
        return None
    libs = os.path.join(os.path.dirname(list(spec.submodule_search_locations)[0]), "numpy.libs")
    found = sorted(glob.glob(os.path.join(libs, "lib*openblas*.so*")))
    return found[0] if found else None


def probe(library: str, coretype: Optional[str] = None) -> Optional[str]:
    """The core the library picks, asked in a child interpreter (with ``coretype`` forced)."""
    import subprocess  # here, not at start: only a probe needs it

    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    env.update({"OPENBLAS_NUM_THREADS": "1", SWITCH: "0"})
    if coretype is not None:
        env[VARIABLE] = coretype
    try:
        out = subprocess.run([sys.executable, "-S", "-c", _PROBE, library], env=env,
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip() or None


def choose(library: str, flags: frozenset) -> Dict[str, Optional[str]]:
    """What the library detects, and the core to set instead (None: leave it)."""
    detected = probe(library)
    choice = None
    if detected in GENERIC:
        choice = next((c for c in candidates(flags) if probe(library, c) == c), None)
    return {"detected": detected, "choice": choice}


def cache_file() -> str:
    root = (os.environ.get("MNPAR_CACHE_DIR")
            or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                            "mnpar"))
    return os.path.join(root, "openblas-coretype.json")


def identity(library: str, info: Dict[str, str]) -> str:
    """The cache key: this library file on this CPU."""
    stat = os.stat(library)
    return json.dumps([os.path.realpath(library), stat.st_size, int(stat.st_mtime),
                       info.get("vendor_id"), info.get("cpu family"), info.get("model"),
                       info.get("model name"), info["flags"]])


def _remembered(key: str, library: str, flags: frozenset) -> Dict[str, Optional[str]]:
    path = cache_file()
    try:
        with open(path, encoding="utf-8") as f:
            known = json.load(f)
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), dict):
        return known[key]
    found = choose(library, flags)  # a failed probe is kept too: never a probe per start
    known = known if isinstance(known, dict) else {}
    known[key] = found
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(known, f, indent=1)
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only home: MNPAR_CACHE_DIR can point elsewhere
    return found


def install() -> None:
    """Sets OPENBLAS_CORETYPE where numpy's OpenBLAS would pick a generic core."""
    if VARIABLE in os.environ or os.environ.get(SWITCH) == "0" or "numpy" in sys.modules:
        return
    info = cpu()
    if info is None:
        return
    flags = frozenset(info["flags"].split())
    if not candidates(flags):
        return
    library = numpy_openblas()
    if library is None:
        return
    found = _remembered(identity(library, info), library, flags)
    decision.update(found, library=library)
    if found.get("choice"):
        os.environ[VARIABLE] = str(found["choice"])
