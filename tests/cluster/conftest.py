"""The cluster tests: mpiexec across test hosts (``_hosts.py``), and Slurm on them
(``_slurm.py``), run by ``make test-cluster``.

They need root, make network namespaces and take minutes, so they run only
where this folder (or a file in it) is named on pytest's command line:
``make test``, which collects ``tests/``, and its runs under ``mpiexec`` leave
them out. This pytest runs in one process in the root namespace; each test
launches one ``mpiexec`` over the hosts with a hard timeout, so a hang fails in
a minute, and checks what every rank printed.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# isort: split
import _hosts  # noqa: E402
import _slurm  # noqa: E402
import _timings  # noqa: E402

HOSTS = 4  # the most any test uses: 4 hosts x 1 rank


def _named(config) -> bool:
    for arg in config.args:
        path = os.path.abspath(os.path.join(str(config.invocation_params.dir),
                                            arg.split("::")[0]))
        if path == HERE or path.startswith(HERE + os.sep):
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    if not _named(config):
        return True
    return None


@pytest.fixture(scope="session")
def cluster():
    """Test hosts h1..h4, made once and always removed; skips where they cannot be made."""
    hosts = _hosts.Cluster(HOSTS)
    try:
        hosts.up()
    except _hosts.Unavailable as e:
        pytest.skip(str(e))
    try:
        yield hosts
    finally:
        hosts.down()


@pytest.fixture(scope="session")
def slurm(cluster):
    """A Slurm controller on h0 and a slurmd on each of h1..h4, started at the first test
    that asks and always stopped; skips where Slurm is not installed."""
    reason = _slurm.unavailable()
    if reason:
        pytest.skip(f"needs {reason}")
    with _slurm.Slurm(cluster) as running:
        yield running


def pytest_terminal_summary(terminalreporter):
    lines = _timings.table()
    if lines:
        terminalreporter.write_sep("-", "time from each failure to its job's end (Slurm)")
        for line in lines:
            terminalreporter.write_line(line)
