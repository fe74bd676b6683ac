"""Shared fixtures and the rules of the MPI test harness.

The suite runs once in one process and then under ``mpiexec`` at several rank
counts (``tests/run_suite.py``). Under ``mpiexec`` only ``mpi``-marked tests
run. Every rank writes its counts to the file named by ``MNPAR_TEST_REPORT``
so the runner can add them up.

What a test needs is a marker, checked here (``REQUIREMENTS``) and nowhere
else. Where something is missing the test is skipped before it starts, with
the reason ``needs <what>``::

    marker            skipped where                                    reason, e.g.
    mpi(min_size=k)   fewer than k ranks run it                        needs 2 ranks, has 1
    gpu               cupy or a CUDA device is missing                 needs cupy and a CUDA device
    nccl              cupy's NCCL is missing, or ranks outnumber       needs cupy's NCCL library
                      the CUDA devices (NCCL takes one rank a device)
    chainermn         ChainerMN (inside chainer's wheel) does not      needs chainermn (...)
                      import: the tests that compare with it

The largest ``min_size`` among a test's markers counts, so a parameter that
needs more ranks than the rest carries its own:
``pytest.param("chain", marks=pytest.mark.mpi(min_size=3))``. A spatial test
takes the ``grid`` fixture (or calls ``grids(shape)``): the ranks a grid leaves
over skip it with the reason ``rank r is left over: ...``. Conditions of
the machine or the stack (numpy 2, AVX-512, a BLAS library) are
``@pytest.mark.skipif`` markers in their modules. No test body calls
``pytest.skip`` for ranks, devices or ChainerMN.
"""
import functools
import json
import os
import warnings
from typing import Callable, Dict, Optional

import pytest

MARKERS = {
    "nccl": "nccl: needs cupy's NCCL and a CUDA device per rank; skipped otherwise",
    "chainermn": "chainermn: compares with ChainerMN; skipped where it does not import",
}


def pytest_configure(config):
    listed = {line.split(":")[0].split("(")[0] for line in config.getini("markers")}
    for name, line in MARKERS.items():
        if name not in listed:
            config.addinivalue_line("markers", line)


@functools.cache
def _world_size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.size


@functools.cache
def _devices() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def _ranks(item: pytest.Item) -> Optional[str]:
    # The most any of its markers asks: module, function or parameter.
    need = max(m.kwargs.get("min_size", 1) for m in item.iter_markers("mpi"))
    size = _world_size()
    return f"{need} ranks, has {size}" if size < need else None


def _gpu_missing() -> Optional[str]:
    return None if _devices() else "cupy and a CUDA device"


@functools.cache
def _nccl_missing() -> Optional[str]:
    if _gpu_missing():
        return _gpu_missing()
    from mnpar.communicators import _nccl

    if not _nccl.nccl_usable():
        return "cupy's NCCL library"
    if _world_size() > _devices():
        return f"a CUDA device per rank, has {_devices()} for {_world_size()} ranks"
    return None


@functools.cache
def _chainermn_missing() -> Optional[str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import chainermn  # noqa: F401
    except ImportError as e:
        return f"chainermn ({e})"
    return None


# Each requirement marker and what a test carrying it lacks here (None: nothing).
REQUIREMENTS: Dict[str, Callable[[pytest.Item], Optional[str]]] = {
    "mpi": _ranks,
    "gpu": lambda item: _gpu_missing(),
    "nccl": lambda item: _nccl_missing(),
    "chainermn": lambda item: _chainermn_missing(),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name, missing in REQUIREMENTS.items():
            reason = missing(item) if item.get_closest_marker(name) else None
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"needs {reason}"))
                break


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


@pytest.fixture(scope="module")
def grids():
    """``grids(shape)``: a spatial grid over as many whole grids of ranks as the world
    holds, each shape made once per module: making one (collective splits) costs more
    than a test case. Every rank calls it; on the ranks left over (3 ranks, grids of 2)
    it skips the test, saying which ranks the grid uses."""
    import math

    import mnpar

    world = mnpar.create_communicator("naive", timeout=20)
    made = {}

    def grid_of(shape):
        if shape not in made:
            used = world.size - world.size % math.prod(shape)
            sub = world.split(int(world.rank >= used), world.rank)
            grid = mnpar.spatial.SpatialGrid(sub, shape) if world.rank < used else None
            made[shape] = sub, grid, used
        grid, used = made[shape][1:]
        if grid is None:
            pytest.skip(f"rank {world.rank} is left over: grids of {shape} use ranks "
                        f"0..{used - 1} of {world.size}")
        return grid

    yield grid_of
    for sub, grid, _ in made.values():  # the same order on every rank
        if grid is not None:
            grid.free()
        sub.finalize()
    world.finalize()


@pytest.fixture
def grid(grids, shape):
    """The spatial grid of the test's ``shape`` parameter (``grids(shape)``: a rank left
    over skips)."""
    return grids(shape)
