"""BLAS threads are limited to a rank's share of the node's cores."""
import pytest
from threadpoolctl import threadpool_info

from mnpar.communicators import _blas

HAS_BLAS = any(p["user_api"] == "blas" for p in threadpool_info())  # numpy's, loaded by now


@pytest.mark.skipif(not HAS_BLAS, reason="needs a BLAS library loaded")
def test_share_of_cores(monkeypatch):
    for v in (*_blas.THREAD_VARIABLES, "SLURM_CPUS_PER_TASK"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(_blas, "cores", lambda: 8)
    assert _blas.limit_blas_threads(4) == 2
    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    assert blas and all(p["num_threads"] == 2 for p in blas)
    assert _blas.limit_blas_threads(16) == 1


def test_user_setting_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _blas.limit_blas_threads(2) is None


def test_slurms_cores_per_task_are_the_share(monkeypatch):
    # srun --cpus-per-task=4 binds each task to its 4 cores: sched_getaffinity sees 4,
    # which divided among the node's ranks again would leave each too few threads.
    monkeypatch.setattr(_blas, "cores", lambda: 4)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert _blas.threads_for(2) == 4
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "")
    assert _blas.threads_for(2) == 2
