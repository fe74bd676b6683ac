"""Ranks that finish, across test hosts: the cases of test_communicators_ending over TCP.

``tests/scripts/endings.py`` runs with one rank per host (h1, h2, h3), so every
end notice and every unread message crosses a veth. A wait for a rank that
has finished must end the job within seconds of that rank's end, with the
same ``PeerFinished`` text as on one host; a correct program with several
models on subsets of the ranks must end without a word from mnpar or MPI
(UCX warns of every message left unmatched at ``MPI_Finalize``).
"""
import os
import re
import sys
import time

import pytest
from _hosts import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests"))
# isort: split
from test_communicators_ending import (  # noqa: E402  the one host's cases and texts
    CUT,
    ENV,
    FINISHED,
    SOON,
    UNREAD_LINES,
)

SCRIPT = os.path.join(ROOT, "tests", "scripts", "endings.py")


def launch(cluster, case, hosts):
    env = cluster.env(MNPAR_TIMEOUT="600", **ENV.get(case, {}))
    code, out, err = cluster.run([1] * hosts, [sys.executable, SCRIPT, case], timeout=120,
                                 env=env)
    return code, out, err, time.monotonic()


@pytest.mark.parametrize("case", sorted(FINISHED))
def test_a_wait_for_a_rank_on_another_host_that_finished(cluster, case):
    code, out, err, ended = launch(cluster, case, 2)
    assert code not in (0, None), err[-CUT:]
    assert re.search(FINISHED[case], err), err[-CUT:]
    finishes = [float(t) for t in re.findall(r"rank \d+ finishes at ([0-9.]+)", err)]
    assert finishes and ended - min(finishes) < SOON, err[-CUT:]
    assert "CommunicationTimeout" not in err, err[-CUT:]


def test_unread_messages_across_hosts_are_reported_and_nothing_else(cluster):
    code, out, err, _ = launch(cluster, "unread", 2)
    assert code == 0, err[-CUT:]
    assert [line for line in err.splitlines() if line.strip()] == UNREAD_LINES, err


def test_several_models_across_hosts_end_without_mpi_warnings(cluster):
    code, out, err, _ = launch(cluster, "several_models", 3)
    assert code == 0, err[-CUT:]
    assert out.count("done") == 3, out
    assert err == "", err  # no "UCX WARN unexpected tag-receive descriptor"
