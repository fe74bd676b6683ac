"""How close mnpar's ping-pong is to its protocol written bare in mpi4py.

    mpiexec -n 2 python benchmarks/p2p_floor.py [--sizes 4096,262144] [--rounds 15]

``bench_p2p`` compares mnpar with raw ``Send``/``Recv``. This splits that gap
in two: what mnpar's protocol costs however it is written, and what mnpar's
Python adds to it. Interleaved in the same rounds, each the best of them:

``raw``
    ``Send``/``Recv`` into a preallocated buffer.
``bare``
    mnpar's protocol with nothing around it, busy ``Test`` loops for waits:
    up to 64 KiB one inline message (header and a copy of the array)
    received by a persistent receive and copied out; above, the header and
    then the array's own memory, the array's receive posted once the header
    has been read.
``bare, mnpar's waits``
    the same, each wait through ``_wait.wait`` (its quick phase of 32
    tests, then the clock read and pause between tests).
``bare, posted early`` (above 64 KiB)
    the same two messages, the payload on a second communicator and its
    receive posted before the header arrives (its size known in advance):
    what posting the payload's receive sooner could gain at best.
``one message, struct datatype`` (above 64 KiB)
    the header and the array's own memory as ONE message, through an MPI
    struct datatype made (and freed) per message, received by a matched
    probe into one buffer of which the array is a view: what folding the
    header into the payload's message, with no copy, would cost.
``transport``
    mnpar's ``Transport.send``/``recv``: no ``Communicator`` method and no
    argument check around them.
``mnpar``
    ``Communicator.send``/``recv``.

Printed: each one-way time, its best-of excess over raw and the median
and quartiles of each round's excess.
"""
import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu, interleaved, paired_excess, pingpong, table, timed  # noqa: E402

import mnpar  # noqa: E402
from mnpar.communicators import _message as message  # noqa: E402
from mnpar.communicators._transport import INLINE_LIMIT  # noqa: E402
from mnpar.communicators._wait import wait  # noqa: E402


def until(done) -> None:
    while not done():
        pass


def waited(requests, status=None):
    wait(requests, None, str, status)


def cases(nbytes, world, mn, first, second):
    rank, peer = world.rank, 1 - world.rank
    data = np.full(nbytes // 4, rank, np.float32)
    buf = np.empty(nbytes // 4, np.float32)
    rbuf = np.empty(INLINE_LIMIT, np.uint8)
    reader = message.Reader(rbuf)
    header = message.encode_one(data, 0)
    repeat = max(20, min(2000, (64 << 20) // nbytes))
    status = MPI.Status()
    arrive = first.Recv_init([rbuf, MPI.BYTE], peer, 1)
    inline = nbytes + message.MAX_HEADER_ONE <= rbuf.size

    def raw_send():
        world.Send(data, peer, 1)

    def raw_recv():
        world.Recv(buf, peer, 1)

    def bare(waiting):
        def send():
            if inline:
                waiting([first.Isend([message.pack_one(data, message.INLINE), MPI.BYTE],
                                     peer, 1)])
                return
            waiting([first.Isend([header, MPI.BYTE], peer, 1),
                     first.Isend([data, MPI.BYTE], peer, 1)])

        def recv():
            arrive.Start()
            waiting([arrive], status)
            head, view = reader.read()
            if view is not None:
                return view.copy()
            dtype, shape = head.specs[0]
            a = np.empty(shape, dtype)
            waiting([first.Irecv([a, MPI.BYTE], peer, 1)])
            return a
        return send, recv

    def busy(requests, status=None):
        if len(requests) == 1:
            test = requests[0].Test
            until(lambda: test(status))
        else:
            until(lambda: MPI.Request.Testall(requests))

    def early_send():
        busy([first.Isend([header, MPI.BYTE], peer, 1),
              second.Isend([data, MPI.BYTE], peer, 1)])

    def early_recv():
        a = np.empty(data.shape, data.dtype)
        payload = second.Irecv([a, MPI.BYTE], peer, 1)
        arrive.Start()
        busy([payload, arrive])
        reader.read()
        return a

    def struct_send():
        layout = MPI.BYTE.Create_hindexed([len(header), nbytes],
                                          [MPI.Get_address(header), MPI.Get_address(data)])
        layout.Commit()
        first.Send([MPI.BOTTOM, 1, layout], peer, 2)
        layout.Free()

    def struct_recv():
        msg = first.Mprobe(peer, 2, status)
        received = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        msg.Recv([received, MPI.BYTE])
        return received[len(header):].view(data.dtype)

    def case(send, recv):
        return lambda: timed(pingpong(send, recv, rank), repeat) / 2

    out = {"raw": case(raw_send, raw_recv), "bare": case(*bare(busy)),
           "bare, mnpar's waits": case(*bare(waited))}
    if not inline:
        out["bare, posted early"] = case(early_send, early_recv)
        out["one message, struct datatype"] = case(struct_send, struct_recv)
    transport = mn._t  # mnpar's own internals: what the Communicator adds, split off
    out["transport"] = case(lambda: transport.send(data, peer, 3),
                            lambda: transport.recv(peer, 3))
    out["mnpar"] = case(lambda: mn.send(data, peer, 2), lambda: mn.recv(peer, 2))
    return out, arrive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4096,65536,262144,1048576",
                        help="message sizes in bytes, comma-separated")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        sys.exit("run with exactly 2 ranks")
    mn = mnpar.create_communicator("naive")
    first, second = world.Dup(), world.Dup()
    rows = []
    for nbytes in (int(size) for size in args.sizes.split(",")):
        measured, arrive = cases(nbytes, world, mn, first, second)
        times = interleaved(measured, args.rounds)
        arrive.Free()
        raw = min(times["raw"])
        for name, each in times.items():
            first_q, median, third = (d * 1e6 for d in paired_excess(times, name))
            rows.append([f"{nbytes >> 10} KiB", name, f"{min(each) * 1e6:.2f}",
                         f"{(min(each) - raw) * 1e6:+.2f}",
                         f"{median:+.2f} [{first_q:+.2f}, {third:+.2f}]"])
    if world.rank == 0:
        print(f"one-way time, best of {args.rounds} interleaved rounds ({cpu()})")
        print(table(["size", "case", "us", "us over raw", "(per round)"], rows))
    first.Free()
    second.Free()
    mn.finalize()


if __name__ == "__main__":
    main()
