"""Shared fixtures and the rules of the MPI test harness.

The suite runs once in one process and then under ``mpiexec`` at several rank
counts (``tests/run_suite.py``). A test marked ``mpi(min_size=k)`` is skipped,
with the reason, where fewer than ``k`` ranks run it. Under ``mpiexec`` only
``mpi``-marked tests run. Every rank writes its counts to the file named by
``MNPAR_TEST_REPORT`` so the runner can add them up.
"""
import json
import os

import pytest


def _world_size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.size


def pytest_collection_modifyitems(config, items):
    size = _world_size()
    for item in items:
        marker = item.get_closest_marker("mpi")
        if marker is None:
            continue
        need = marker.kwargs.get("min_size", 1)
        if size < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} ranks, has {size}"))
    for item in items:
        if item.get_closest_marker("gpu") is not None and not _has_gpu():
            item.add_marker(pytest.mark.skip(reason="needs cupy and a CUDA device"))


def _has_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.fixture
def world():
    """The MPI world communicator (the user's communicator in tests)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture
def comm():
    """A fresh ``naive`` mnpar communicator over the world."""
    import mnpar

    c = mnpar.create_communicator("naive")
    yield c
    c.finalize()


@pytest.fixture
def mcomm():
    """A ``naive`` communicator whose waits give up after 20 s: a deadlocked test fails fast."""
    import mnpar

    c = mnpar.create_communicator("naive", timeout=20)
    yield c
    c.finalize()


def pytest_terminal_summary(terminalreporter):
    path = os.environ.get("MNPAR_TEST_REPORT")
    if not path:
        return
    stats = terminalreporter.stats
    counts = {key: len(stats.get(key, [])) for key in ("passed", "failed", "skipped", "error")}
    with open(path, "w") as f:
        json.dump(counts, f)
