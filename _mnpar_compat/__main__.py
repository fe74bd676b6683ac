"""Prints what mnpar's start-up hooks did in this interpreter: ``python -m _mnpar_compat``."""
import os

import chainer  # importing it applies the patches it needs
import numpy
from threadpoolctl import threadpool_info

from . import _chainer, _openblas

print(f"numpy {numpy.__version__}, chainer {chainer.__version__}")
print("chainer patches applied:", ", ".join(_chainer.applied) or "none")
for patch in _chainer.PATCHES:
    print(f"  {patch.name}: {patch.why}")
print("removed numpy names served to chainer so far:",
      ", ".join(sorted(_chainer.served)) or "none")
print(f"OPENBLAS_CORETYPE={os.environ.get(_openblas.VARIABLE, '')!s} "
      f"(start-up hook: {_openblas.decision or 'not needed'})")
for pool in threadpool_info():
    if pool["internal_api"] == "openblas":
        print(f"OpenBLAS {pool['version']} runs {pool['architecture']} kernels: "
              f"{pool['filepath']}")
