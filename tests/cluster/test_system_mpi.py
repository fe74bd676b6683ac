"""The distribution's MPIs across test hosts, without Slurm: their launchers, and the flags
and variables each needs (docs/installation.rst, "Using a system MPI instead").

Open MPI's ``mpirun`` starts its daemons through ``netns_launcher.sh`` (its
``plm_rsh_agent``, where a cluster has ssh) from the login host h0, with a
host file; Debian's MPICH uses its own hydra like the wheel's. Checked here:

* ``intra_rank``/``inter_rank`` and exact means under each (``scripts/communicators.py``);
* Open MPI refuses more ranks than a host file's slots, and ``--oversubscribe``
  (or ``OMPI_MCA_rmaps_base_oversubscribe=1``) lets them run;
* Open MPI as root needs ``OMPI_ALLOW_RUN_AS_ROOT=1`` and ``..._CONFIRM=1``;
* Open MPI's TCP interface (``btl_tcp_if_include``): the test network carries
  the data; an interface that does not reach the other hosts (``lo``) makes
  Open MPI warn ("failed to TCP connect to a peer", or "accepted a TCP connection
  from ... another Open MPI process but cannot find" it) and hang;
* UCX: both MPICHs send between the test hosts through shared memory (0 bytes
  over the veths: UCX sees one machine) unless ``UCX_TLS=tcp``; Open MPI's
  ob1 sends over TCP with no UCX setting at all.
"""
import os
import re
import signal
import subprocess
import threading

import pytest
from _hosts import INNER, LAUNCHER, ROOT, Cluster, address, results
from _mpis import MPIS, TEST_NETWORK
from test_cluster_communicators import expected_topology

SCRIPTS = os.path.join(ROOT, "tests", "cluster", "scripts")
pytestmark = pytest.mark.timeout(300)


def need(mpi) -> None:
    reason = mpi.unavailable()
    if reason:
        pytest.skip(f"needs {reason}")


def on_h0(argv, env, timeout=120, until=None):
    """Runs ``argv`` on the login host h0: ``(code, out, err)``; None past ``timeout``, or
    once ``until`` is in its standard error (then it is killed)."""
    proc = subprocess.Popen([os.path.join(ROOT, "tests", "cluster", "host.sh"), "h0", *argv],
                            cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    if until is None:
        try:
            out, err = proc.communicate(timeout=timeout)
            return proc.returncode, out, err
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return None, out, err
    lines, seen = [], threading.Event()

    def read():
        for line in proc.stderr:
            lines.append(line)
            if until in line:
                seen.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen.wait(timeout)
    os.killpg(proc.pid, signal.SIGKILL)
    reader.join(10)
    out = proc.stdout.read()
    proc.wait()
    for i in range(1, 3):  # the daemons and ranks on the hosts, left behind by the kill
        for pid in Cluster.pids(i):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    line = f.read()
                if SCRIPTS.encode() in line or b"orted" in line:
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return None, out, "".join(lines)


def mpirun(hosts, n, program, *flags, slots=2):
    """Open MPI's mpirun from h0 over a host file of ``hosts`` with ``slots`` each."""
    hostfile = os.path.join(ROOT, "build", f"hosts-{os.getpid()}")
    os.makedirs(os.path.dirname(hostfile), exist_ok=True)
    with open(hostfile, "w") as f:
        f.write("".join(f"h{i} slots={slots}\n" for i in hosts))
    return [MPIS["openmpi"].launcher(), "--hostfile", hostfile, "--mca", "plm_rsh_agent",
            LAUNCHER, *flags, "-n", str(n), *program]


def hydra(mpi, layout, program):
    hosts = ",".join(f"h{i + 1}:{k}" for i, k in enumerate(layout))
    return [mpi.launcher(), "-iface", INNER, "-launcher", "ssh", "-launcher-exec",
            LAUNCHER, "-hosts", hosts, "-n", str(sum(layout)), *program]


def env_of(mpi, **extra):
    env = Cluster.env(**mpi.env())
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


@pytest.mark.parametrize("layout", [[2, 2], [1, 1, 1, 1]], ids=["2x2", "4x1"])
@pytest.mark.parametrize("name", ["openmpi", "mpich"])
def test_topology_and_means_under_the_systems_launcher(cluster, name, layout):
    mpi = MPIS[name]
    need(mpi)
    program = [mpi.python, os.path.join(SCRIPTS, "communicators.py")]
    hosts = range(1, len(layout) + 1)
    argv = (mpirun(hosts, sum(layout), program, slots=layout[0]) if name == "openmpi"
            else hydra(mpi, layout, program))
    code, out, err = on_h0(argv, env_of(mpi), timeout=180)
    assert code == 0, (out, err)
    found = results(out)
    addresses = [r["address"] for r in found]
    assert addresses == [address(h + 1) for h, k in enumerate(layout) for _ in range(k)]
    expected = expected_topology(addresses)
    for r in found:
        for communicator, got in r["topology"].items():
            assert got == expected[r["rank"]], f"rank {r['rank']}, {communicator}"


def test_open_mpi_wants_oversubscribe_for_more_ranks_than_slots(cluster):
    need(MPIS["openmpi"])
    env = env_of(MPIS["openmpi"])
    program = [MPIS["openmpi"].python, os.path.join(SCRIPTS, "traffic.py")]
    code, out, err = on_h0(mpirun([1], 2, program, slots=1), env)
    assert code != 0 and "There are not enough slots available in the system" in out + err
    for flags, extra in (([], {"OMPI_MCA_rmaps_base_oversubscribe": "1"}),
                         (["--oversubscribe"], {})):
        code, out, err = on_h0(mpirun([1], 2, program, *flags, slots=1), {**env, **extra})
        assert code == 0, (flags, out, err)
        assert results(out)[0]["hosts"] == ["h1", "h1"]


@pytest.mark.skipif(os.geteuid() != 0, reason="Open MPI refuses root only")
def test_open_mpi_as_root_wants_the_two_variables(cluster):
    need(MPIS["openmpi"])
    env = env_of(MPIS["openmpi"], OMPI_ALLOW_RUN_AS_ROOT=None,
                 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=None)
    program = [MPIS["openmpi"].python, os.path.join(SCRIPTS, "traffic.py")]
    code, out, err = on_h0(mpirun([1], 1, program), env)
    assert code != 0 and "has detected an attempt to run as root" in out + err


def test_open_mpi_sends_over_the_interface_it_is_given(cluster):
    need(MPIS["openmpi"])
    env = env_of(MPIS["openmpi"])
    program = [MPIS["openmpi"].python, os.path.join(SCRIPTS, "traffic.py")]
    sent = Cluster.sent_bytes(2)
    code, out, err = on_h0(mpirun([1, 2], 2, program, slots=1), env)
    assert code == 0, (out, err)
    assert results(out)[0]["hosts"] == ["h1", "h2"]
    assert Cluster.sent_bytes(2) - sent > 8 << 20  # h2's half crossed its veth
    assert env["OMPI_MCA_btl_tcp_if_include"] == TEST_NETWORK
    code, out, err = on_h0(mpirun([1, 2], 2, program, slots=1),
                           {**env, "OMPI_MCA_btl_tcp_if_include": "lo"},
                           timeout=60, until="WARNING: Open MPI")
    # Which rank's warning comes first varies: a connect to its own lo, or a connect met
    # there by a stranger.
    assert re.search(r"WARNING: Open MPI (failed to TCP connect to a peer MPI process|accepted "
                     r"a TCP connection from what appears to be a\s+another Open MPI process "
                     r"but cannot find)", err), (out, err)


@pytest.mark.parametrize("name", ["mpich-wheel", "mpich", "openmpi"])
def test_ucx_and_the_network_between_hosts(cluster, name):
    mpi = MPIS[name]
    need(mpi)
    program = [mpi.python, os.path.join(SCRIPTS, "traffic.py")]
    argv = mpirun([1, 2], 2, program, slots=1) if name == "openmpi" else hydra(mpi, [1, 1],
                                                                              program)
    crossed = {}
    for ucx in ("tcp", None):
        env = env_of(mpi, UCX_TLS=ucx, UCX_NET_DEVICES=None)
        sent = Cluster.sent_bytes(2)
        code, out, err = on_h0(argv, env)
        assert code == 0, (ucx, out, err)
        crossed[ucx] = Cluster.sent_bytes(2) - sent
    assert crossed["tcp"] > 8 << 20, crossed
    if name == "openmpi":
        assert crossed[None] > 8 << 20, crossed  # ob1 over TCP: UCX plays no part
    else:
        assert crossed[None] < 1 << 20, crossed  # UCX's shared memory, across "hosts"
