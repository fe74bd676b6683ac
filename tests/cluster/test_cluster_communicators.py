"""Communicators across test hosts: the topology the kernel sees, and exact means.

``scripts/communicators.py`` runs on 2 hosts x 2 ranks and on 4 hosts x 1
rank, with mnpar's simulated nodes (``MNPAR_RANKS_PER_NODE``) unset: the
nodes are MPI's own shared-memory split. Each rank checks the ``naive``,
``flat`` and ``hierarchical`` means against its own float64 sum and reports
its address; here the topology is derived from those addresses alone and
compared with what every communicator said.
"""
import os
import sys

import pytest
from _hosts import ROOT, Cluster, address, results

SCRIPT = os.path.join(ROOT, "tests", "cluster", "scripts", "communicators.py")


def expected_topology(addresses):
    """(intra_rank, intra_size, inter_rank, inter_size) per rank, from where each rank runs."""
    hosts = sorted(set(addresses), key=addresses.index)  # in the order of their first rank
    out = []
    for rank, a in enumerate(addresses):
        mates = [r for r, b in enumerate(addresses) if b == a]
        out.append([mates.index(rank), len(mates), hosts.index(a), len(hosts)])
    return out


@pytest.mark.parametrize("layout", [[2, 2], [1, 1, 1, 1]], ids=["2x2", "4x1"])
def test_topology_and_means_across_hosts(cluster, layout):
    before = [Cluster.sent_bytes(i + 1) for i in range(len(layout))]
    out = cluster.run_ok(layout, [sys.executable, SCRIPT], timeout=60)
    sent = [Cluster.sent_bytes(i + 1) - b for i, b in enumerate(before)]
    found = results(out)
    assert [r["rank"] for r in found] == list(range(sum(layout))), out
    addresses = [r["address"] for r in found]
    assert addresses == [address(h + 1) for h, k in enumerate(layout) for _ in range(k)]
    expected = expected_topology(addresses)
    # Across real hosts, waits spin for the network before they sleep (_wait.across_hosts).
    assert {r["spin_bandwidth"] for r in found} == {1e8}, found  # NETWORK_SPIN_BANDWIDTH
    for r in found:
        for name, got in r["topology"].items():
            assert got == expected[r["rank"]], f"rank {r['rank']}, {name}"
    # Each host sent at least the largest gradient once (8 x 120,000 bytes) over its veth.
    assert min(sent) > 8 * 120_000, sent
