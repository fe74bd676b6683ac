"""Where a ping-pong's time goes: cProfile self time per function, on both ranks.

    mpiexec -n 2 python benchmarks/profile_p2p.py [--sizes 4096,262144] [--gpu]

For each size, mnpar's ``send``/``recv`` ping-pong runs once unprofiled (the
one-way time printed first) and once under cProfile. Each line is a
function's own time per round trip, in microseconds, and its calls per round
trip. MPI calls made from a Python function count in that function's own time
(mpi4py's methods are not seen by cProfile), so the time a wait spends for
the peer shows up in ``wait``. cProfile's own cost roughly doubles the total.
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu, pingpong  # noqa: E402

import mnpar  # noqa: E402

LINES = 14


def profile(one, reps):
    prof = cProfile.Profile()
    MPI.COMM_WORLD.Barrier()
    prof.enable()
    for _ in range(reps):
        one()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = [(own / reps * 1e6, calls / reps, f"{os.path.basename(f)}:{line}({name})")
            for (f, line, name), (calls, _, own, _, _) in stats.items()]
    return sorted(rows, reverse=True)[:LINES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4096,262144", help="bytes, comma-separated")
    parser.add_argument("--gpu", action="store_true", help="send cupy arrays")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        sys.exit("run with exactly 2 ranks")
    mn = mnpar.create_communicator("naive")
    xp = np
    if args.gpu:
        import cupy as xp

        xp.cuda.Device(mn.intra_rank % xp.cuda.runtime.getDeviceCount()).use()
    rank, peer = world.rank, 1 - world.rank
    if rank == 0:
        print(f"{cpu()}; {'cupy' if args.gpu else 'numpy'} arrays")
    for nbytes in (int(s) for s in args.sizes.split(",")):
        data = xp.full(nbytes // 4, rank, np.float32)
        reps = max(50, min(3000, (64 << 20) // nbytes))
        one = pingpong(lambda data=data: mn.send(data, peer, 2), lambda: mn.recv(peer, 2), rank)
        for _ in range(reps // 5):
            one()
        world.Barrier()
        start = time.perf_counter()
        for _ in range(reps):
            one()
        plain = (time.perf_counter() - start) / reps / 2
        ranks = world.gather(profile(one, reps), 0)
        if rank == 0:
            print(f"\n{nbytes} bytes: one-way {plain * 1e6:.1f} us unprofiled; "
                  f"own us per round trip under cProfile, calls per round trip")
            for r, rows in enumerate(ranks):
                print(f"  rank {r}")
                for us, calls, name in rows:
                    print(f"  {us:8.2f}  x{calls:4.1f}  {name}")
    mn.finalize()


if __name__ == "__main__":
    main()
