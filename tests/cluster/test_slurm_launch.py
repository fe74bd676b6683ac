"""Launching under Slurm on the test hosts: every launcher, its ranks placed right.

``scripts/communicators.py`` (the means of ``naive``, ``flat`` and
``hierarchical`` against a float64 sum, and each rank's address and
topology) runs under each launcher of ``_mpis.LAUNCHERS``: ``srun --mpi=pmi2``
(Debian's MPICH), ``srun --mpi=pmix`` (Open MPI), and inside ``salloc`` the
mpich wheel's hydra ``mpiexec`` and Open MPI's ``mpirun``, which find the
allocation themselves. ``intra_rank``/``inter_rank`` must equal the topology
derived from each rank's address on 2 nodes x 2 tasks, 4 x 1 and, with
``srun``, tasks dealt to the nodes in turn (``-m cyclic``: ranks 0 and 2 on
h1); every rank's host name is its node's (each slurmd's own UTS name).
"""
import os

import pytest
from _hosts import ROOT, Cluster, address, results
from _mpis import LAUNCHERS, MPIS
from test_cluster_communicators import expected_topology

SCRIPT = os.path.join(ROOT, "tests", "cluster", "scripts", "communicators.py")
pytestmark = pytest.mark.timeout(300)
LAYOUTS = {"2x2": (2, 2, ()), "4x1": (4, 1, ()), "cyclic": (2, 2, ("-m", "cyclic"))}


def need(mpi) -> None:
    reason = mpi.unavailable()
    if reason:
        pytest.skip(f"needs {reason}")


# Every launcher in blocks on 2 and 4 nodes; srun's own cyclic distribution as well.
CASES = [(name, layout) for name in sorted(LAUNCHERS) for layout in sorted(LAYOUTS)
         if LAUNCHERS[name].srun or not LAYOUTS[layout][2]]


@pytest.mark.parametrize("name, layout", CASES, ids=[f"{n}-{lay}" for n, lay in CASES])
def test_topology_and_means_under_each_launcher(slurm, name, layout):
    launcher = LAUNCHERS[name]
    need(launcher.mpi)
    nodes, per_node, distribution = LAYOUTS[layout]
    hosts = list(range(1, nodes + 1))
    where = ["-w", ",".join(f"h{i}" for i in hosts)]
    before = [Cluster.sent_bytes(i) for i in hosts]
    out = slurm.run_ok(launcher.command(nodes, per_node, [launcher.mpi.python, SCRIPT],
                                        [*where, *distribution]),
                       timeout=180, env=slurm.env(**launcher.mpi.env()))
    sent = [Cluster.sent_bytes(i) - b for i, b in zip(hosts, before)]
    found = results(out)
    assert [r["rank"] for r in found] == list(range(nodes * per_node)), out
    addresses = [r["address"] for r in found]
    if distribution:
        assert addresses == [address(1 + r % nodes) for r in range(nodes * per_node)]
    else:
        assert addresses == [address(h) for h in hosts for _ in range(per_node)]
    # Each rank's host name is its node's, as slurmd (or its srun-started proxy) has it.
    assert [r["host"] for r in found] == [f"h{int(a.split('.')[-1]) - 10}" for a in addresses]
    assert {r["spin_bandwidth"] for r in found} == {1e8}, found  # waits know: across hosts
    expected = expected_topology(addresses)
    for r in found:
        for communicator, got in r["topology"].items():
            assert got == expected[r["rank"]], f"rank {r['rank']}, {communicator}"
    assert min(sent) > 8 * 120_000, sent  # the largest gradient crossed every host's veth


def test_the_mpich_wheel_under_srun_pmix_is_refused_at_once(slurm):
    # The wheel has no PMIx: MPI_Init says so and the step ends (documented).
    wheel = MPIS["mpich-wheel"]
    code, out, err = slurm.run(["srun", "--mpi=pmix", "-N", "1", "-n", "2", wheel.python, "-c",
                                "from mpi4py import MPI"], timeout=60)
    assert code not in (0, None), (out, err)
    assert "Runtime environment uses unsupported PMI version PMIx" in err, err
