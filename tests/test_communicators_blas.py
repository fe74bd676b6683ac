"""BLAS threads are limited to a rank's share of the node's cores."""
import pytest
from threadpoolctl import threadpool_info

from mnpar.communicators import _blas

HAS_BLAS = any(p["user_api"] == "blas" for p in threadpool_info())  # numpy's, loaded by now


@pytest.mark.skipif(not HAS_BLAS, reason="needs a BLAS library loaded")
def test_share_of_cores(monkeypatch):
    for v in _blas.THREAD_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(_blas, "cores", lambda: 8)
    assert _blas.limit_blas_threads(4) == 2
    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    assert blas and all(p["num_threads"] == 2 for p in blas)
    assert _blas.limit_blas_threads(16) == 1


def test_user_setting_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _blas.limit_blas_threads(2) is None
