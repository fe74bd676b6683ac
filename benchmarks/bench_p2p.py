"""Ping-pong between ranks 0 and 1: raw mpi4py, mnpar and ChainerMN, one run.

    mpiexec -n 2 python benchmarks/bench_p2p.py [--rounds 7] [--gpu] [--against DIR]
        [--sizes 4096,262144] [--rewrite] [--inline-limit BYTES]

``--gpu`` sends cupy arrays (each rank on device ``intra_rank`` modulo the
count). Its raw baseline is what a program does over an MPI that is not
CUDA-aware: copy to the host, ``Send``, ``Recv``, copy to the device.
ChainerMN is left out there: it hands MPI device pointers, which needs a
CUDA-aware MPI.

For each message size, a round times ``repeat`` ping-pongs of each library in
turn (interleaved), and the best round of each is kept. Reported: one-way
time (half a round trip) and bandwidth, and mnpar's and ChainerMN's ratios
to raw mpi4py buffer Send/Recv (bandwidth ratio: higher is better; latency
ratio: lower is better).

``--rewrite`` writes new values into the array before every send, in every
case, as a training step does with the activations it sends. Without it
the same unchanged array is sent again and again, which flatters raw MPI
from 8 KiB: MPICH reads a message of 8 KiB or more straight from the
sender's memory (CMA), and memory just written by the sender's core reads
slower; mnpar's inline path (up to 64 KiB) always sends a copy it has just
written, so it pays that cost in both modes. The rewrite itself (one
``copyto``) is in every case's time, so compare the time over raw.

mnpar's time over raw's is also given as the median (and quartiles) of the
per-round excess: a round's machine state moves both alike, so that figure
resolves differences the best-of cannot (docs/benchmarks.rst). Likewise mnpar's
bandwidth over raw's as the median of each round's ratio (``(per round)``
after ``mnpar lat/raw``), steadier than the ratio of two best-ofs where one
run's scatter is larger than the difference (16 MiB).

``--against DIR`` also measures the mnpar of DIR (a worktree of another
commit: ``git worktree add /tmp/old REV``), interleaved with this one, and
gives each one's time over raw's: before-and-after figures from one run.
Given more than once, it measures each (``against``, ``against2``, ...).
``--inline-limit BYTES`` likewise measures mnpar sending a message inline
(one copy, one MPI message) only up to BYTES and as header and payload
above: whether the 64 KiB limit suits an MPI.
"""
import argparse
import importlib
import os
import sys
import tempfile

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu, interleaved, paired_excess, paired_ratio, pingpong, table, timed  # noqa: E402

import mnpar  # noqa: E402

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]


def cases(nbytes, world, mn, cmn, xp, others, rewrite=False):
    rank, peer = world.rank, 1 - world.rank
    data = xp.full(nbytes // 4, rank, np.float32)
    fresh = xp.full(nbytes // 4, rank + 1, np.float32)
    buf = np.empty(nbytes // 4, np.float32)
    repeat = max(20, min(2000, (64 << 20) // nbytes))

    def sending(send):
        """``send``, after writing the array anew where ``rewrite`` asks for it."""
        if not rewrite:
            return send

        def rewritten():
            xp.copyto(data, fresh)
            send()
        return rewritten

    if xp is np:
        def send_raw():
            world.Send(data, peer, 1)

        def recv_raw():
            world.Recv(buf, peer, 1)
    else:  # through the host, as over an MPI that is not CUDA-aware
        def send_raw():
            world.Send(xp.asnumpy(data), peer, 1)

        def recv_raw():
            world.Recv(buf, peer, 1)
            xp.asarray(buf)

    def raw():
        return timed(pingpong(sending(send_raw), recv_raw, rank), repeat) / 2

    def library(comm, tag):
        """One-way seconds of ``comm.send``/``recv`` (mnpar's or ChainerMN's) on ``tag``."""
        return lambda: timed(pingpong(sending(lambda: comm.send(data, peer, tag)),
                                      lambda: comm.recv(peer, tag), rank), repeat) / 2

    out = {"raw": raw, "mnpar": library(mn, 2)}
    for tag, (name, other) in enumerate(others.items(), 4):
        out[name] = library(other, tag)
    if cmn is not None:
        out["chainermn"] = library(cmn, 3)
    return out


def chainermn_communicator():
    try:
        import chainermn
    except Exception as e:  # pragma: no cover - chainermn ships inside chainer
        print(f"ChainerMN unavailable ({e}); measuring raw and mnpar only", flush=True)
        return None
    return chainermn.create_communicator("naive")


def other_mnpar(path, name="against"):
    """The mnpar package of checkout ``path``, imported as ``mnpar_<name>``."""
    alias = tempfile.mkdtemp()
    module = f"mnpar_{name}"
    os.symlink(os.path.join(os.path.abspath(path), "mnpar"), os.path.join(alias, module))
    sys.path.insert(0, alias)
    return importlib.import_module(module)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--gpu", action="store_true", help="send cupy arrays")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="message sizes in bytes, comma-separated")
    parser.add_argument("--rewrite", action="store_true",
                        help="write the array anew before every send, as training does")
    parser.add_argument("--inline-limit", type=int, metavar="BYTES",
                        help="also measure mnpar with messages inline only up to BYTES")
    parser.add_argument("--against", metavar="DIR", action="append", default=[],
                        help="also measure the mnpar of this checkout (before/after); "
                             "may be given more than once")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        if world.rank == 0:
            print("run with exactly 2 ranks: mpiexec -n 2 python benchmarks/bench_p2p.py")
        sys.exit(1)
    mn = mnpar.create_communicator("naive")
    xp = np
    if args.gpu:
        import cupy as xp

        xp.cuda.Device(mn.intra_rank % xp.cuda.runtime.getDeviceCount()).use()
    cmn = None if args.gpu else chainermn_communicator()
    others = {}  # more mnpar communicators, measured in the same rounds
    against = {"against" if i == 0 else f"against{i + 1}": path
               for i, path in enumerate(args.against)}
    for name, path in against.items():
        others[name] = other_mnpar(path, name).create_communicator("naive")
    if args.inline_limit is not None:
        name = f"inline<={args.inline_limit}"
        others[name] = mnpar.create_communicator("naive")
        others[name]._t.inline_limit = args.inline_limit  # a transport setting, not public
    rows = []
    for nbytes in (int(size) for size in args.sizes.split(",")):
        times = interleaved(cases(nbytes, world, mn, cmn, xp, others, args.rewrite),
                            args.rounds)
        best = {name: min(t) for name, t in times.items()}
        row = [f"{nbytes >> 10} KiB"]
        for name in best:
            if name not in others:
                row += [f"{best[name] * 1e6:.1f}", f"{nbytes / best[name] / 1e9:.2f}"]
        row += [f"{best['raw'] / best['mnpar']:.2f}x", f"{best['mnpar'] / best['raw']:.2f}x",
                f"{paired_ratio(times, 'mnpar'):.3f}x"]
        if "chainermn" in best:
            row += [f"{best['raw'] / best['chainermn']:.2f}x",
                    f"{best['chainermn'] / best['raw']:.2f}x"]
        for name in [*others, "mnpar"]:
            first, median, third = (d * 1e6 for d in paired_excess(times, name))
            row += [f"{(best[name] - best['raw']) * 1e6:+.2f}",
                    f"{median:+.2f} [{first:+.2f}, {third:+.2f}]"]
        rows.append(row)
    header = ["size", "raw us", "raw GB/s", "mnpar us", "mnpar GB/s"]
    if cmn is not None:
        header += ["cmn us", "cmn GB/s"]
    header += ["mnpar bw/raw", "mnpar lat/raw", "(per round)"]
    if cmn is not None:
        header += ["cmn bw/raw", "cmn lat/raw"]
    for name in others:
        header += [f"{name} us-raw", "(per round)"]
    header += ["mnpar us-raw", "(per round)"]
    if world.rank == 0:
        what = "cupy arrays, raw through the host" if args.gpu else "numpy arrays"
        what += ", written anew before every send" if args.rewrite else ""
        print(f"one-way time of {what}, best of {args.rounds} interleaved rounds "
              f"({MPI.Get_library_version().splitlines()[0].strip()}; {cpu()})")
        print(table(header, rows))
        print("targets: mnpar bw/raw >= 0.95 from 256 KiB to 16 MiB (issue 33); "
              "mnpar lat/raw <= 2.0 at 4 KiB")
        print("us-raw: the best-of time over raw's, then the median [quartiles] of each "
              "round's excess; bw/raw (per round): the median of each round's ratio")
        for name, path in against.items():
            print(f"{name}: the mnpar of {path}, interleaved with this one")
        if args.inline_limit is not None:
            print(f"inline<={args.inline_limit}: mnpar sending inline only up to "
                  f"{args.inline_limit} bytes, header and payload above")
    for other in others.values():
        other.finalize()
    mn.finalize()


if __name__ == "__main__":
    main()
