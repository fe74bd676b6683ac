"""Round trip of a 1 KiB message inside one test host and between two (as root).

    python benchmarks/cluster_latency.py [--rounds 7]

Makes two test hosts (tests/cluster/_hosts.py: network namespaces joined by a
bridge, always removed at the end) and runs itself under ``mpiexec`` twice:
both ranks on h1 (MPI's shared memory) and one rank on each host (TCP over
the veths). Each run ping-pongs 1 KiB with raw mpi4py ``Send``/``Recv`` and
with mnpar's ``send``/``recv``, in interleaved rounds of 1000, and keeps each
one's best round; it also times 1 MiB one way. The table gives round trips
in microseconds and the bytes h1 sent over its veth during the run, which
show where the traffic went. Prints the reason and exits 0 where test hosts
cannot be made (not root, no namespaces).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "cluster"))
import _hosts  # noqa: E402
from _common import best_of_interleaved, cpu, pingpong, table, timed  # noqa: E402

SMALL, LARGE = 1 << 10, 1 << 20


def rank_main(rounds: int) -> None:
    """One rank of a run: ping-pongs between ranks 0 and 1, rank 0 prints RESULT."""
    import numpy as np
    from mpi4py import MPI

    import mnpar

    world = MPI.COMM_WORLD
    comm = mnpar.create_communicator("naive", timeout=60)
    rank, peer = world.rank, 1 - world.rank


    def raw(nbytes, repeat):
        data, buf = np.zeros(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        return lambda: timed(pingpong(lambda: world.Send(data, peer, 1),
                                      lambda: world.Recv(buf, peer, 1), rank), repeat)

    def ours(nbytes, repeat):
        data = np.zeros(nbytes, np.uint8)
        return lambda: timed(pingpong(lambda: comm.send(data, peer, 2),
                                      lambda: comm.recv(peer, 2), rank), repeat)

    small = best_of_interleaved({"raw": raw(SMALL, 1000), "mnpar": ours(SMALL, 1000)}, rounds)
    large = best_of_interleaved({"raw": raw(LARGE, 50), "mnpar": ours(LARGE, 50)}, rounds)
    comm.finalize()
    if rank == 0:
        print("RESULT " + json.dumps({"rank": 0, "small": small, "large": large}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if "PMI_RANK" in os.environ:
        rank_main(args.rounds)
        return 0
    reason = _hosts.unavailable()
    if reason:
        print(f"cluster_latency: skipped, needs {reason}")
        return 0
    argv = [sys.executable, "-W", "ignore", os.path.abspath(__file__),
            "--rounds", str(args.rounds)]
    rows = []
    with _hosts.Cluster(2) as hosts:
        for where, layout in (("inside h1", [2]), ("h1 <-> h2", [1, 1])):
            sent = hosts.sent_bytes(1)
            r = _hosts.results(hosts.run_ok(layout, argv, timeout=300))[0]
            sent = hosts.sent_bytes(1) - sent
            small, large = r["small"], r["large"]
            rows.append([where, f"{small['raw'] * 1e6:.1f}", f"{small['mnpar'] * 1e6:.1f}",
                         f"{LARGE / (large['raw'] / 2) / 1e9:.2f}",
                         f"{LARGE / (large['mnpar'] / 2) / 1e9:.2f}", f"{sent / 1e6:.1f}"])
    print(f"1 KiB round trip (us) and 1 MiB bandwidth (GB/s), best of {args.rounds} rounds; "
          f"{cpu()}")
    print(table(["ranks", "raw 1K", "mnpar 1K", "raw 1M", "mnpar 1M", "MB over h1's veth"],
                rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
