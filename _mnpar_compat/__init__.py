"""Start-up hooks mnpar installs into every interpreter of its environment.

``mnpar-compat.pth`` in site-packages runs :func:`install` (through
:mod:`.start`) when Python starts, before any user code, so both hooks work
whether or not mnpar is imported (``import chainer`` alone included). This
package is kept apart from ``mnpar`` because importing ``mnpar`` imports
chainer, mpi4py and numpy, which a start-up hook must not. ``mnpar`` imports :mod:`.start` too, for
interpreters started without the ``.pth`` (``python -S``, a source checkout
on ``PYTHONPATH``).

* :mod:`._chainer` lets chainer 7.8.1 import and run on numpy 1.24+, numpy 2
  and Python 3.12+; ``MNPAR_CHAINER_COMPAT=0`` switches it off.
* :mod:`._openblas` sets ``OPENBLAS_CORETYPE`` where numpy's bundled OpenBLAS
  would run generic kernels on an AVX2/AVX-512 CPU;
  ``MNPAR_OPENBLAS_CORETYPE=0`` (or any ``OPENBLAS_CORETYPE``) switches it off.

``python -m _mnpar_compat`` prints what each hook did in this environment.
"""
import os
import sys

from . import _chainer, _openblas


def install() -> None:
    """Installs both hooks; never raises, so a broken hook cannot stop Python starting."""
    try:
        if os.environ.get("MNPAR_CHAINER_COMPAT") != "0":
            _chainer.install()
        _openblas.install()
    except Exception as error:  # noqa: BLE001 - reported, then Python goes on
        print(f"mnpar: start-up hook failed ({error!r}); MNPAR_CHAINER_COMPAT=0 and "
              "MNPAR_OPENBLAS_CORETYPE=0 switch it off", file=sys.stderr)
