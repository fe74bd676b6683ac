"""Does a waiting rank slow down the rank it waits for?

    mpiexec -n 3 python benchmarks/bench_wait.py

Three ranks on a 2-core machine: rank 0 computes a fixed NumPy workload and
then sends; ranks 1 and 2 wait for that message with raw mpi4py ``Recv``
(MPI polls, one core each), with mnpar's ``recv`` and with ChainerMN's. The
worker's time is compared with a round where the others wait in
``time.sleep`` (the floor), and each waiter's CPU time is read from
``getrusage``, so the CPU share does not depend on machine load.
"""
import os
import resource
import sys
import time
import warnings

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import table  # noqa: E402

import mnpar  # noqa: E402

WORK = 60  # matrix products of 400x400 in the worker's round


def cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def work() -> float:
    a = np.random.default_rng(0).standard_normal((400, 400))
    start = time.perf_counter()
    for _ in range(WORK):
        a = np.tanh(a @ a)
    return time.perf_counter() - start


def one_round(world, wait_for_message, send_message):
    """Returns (worker seconds, this waiter's CPU share of the wait)."""
    world.Barrier()
    if world.rank == 0:
        took = work()
        for peer in range(1, world.size):
            send_message(peer)
        return took, None
    start, c0 = time.perf_counter(), cpu()
    wait_for_message()
    return None, (cpu() - c0) / (time.perf_counter() - start)


def main() -> None:
    world = MPI.COMM_WORLD
    if world.size < 2:
        print("run with 2 or more ranks: mpiexec -n 3 python benchmarks/bench_wait.py")
        sys.exit(1)
    mn = mnpar.create_communicator("naive")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import chainermn

        cmn = chainermn.create_communicator("naive")
    msg = np.ones(4)
    buf = np.empty(4)
    flag = np.zeros(1)

    def sleep_wait():  # the floor: waiters sleep, polling rarely
        req = world.Irecv(flag, 0, 9)
        while not req.Test():
            time.sleep(0.01)

    cases = {
        "idle waiters (floor)": (sleep_wait, lambda p: world.Send(flag, p, 9)),
        "raw mpi4py Recv": (lambda: world.Recv(buf, 0, 1), lambda p: world.Send(msg, p, 1)),
        "mnpar recv": (lambda: mn.recv(0, 2), lambda p: mn.send(msg, p, 2)),
        "chainermn recv": (lambda: cmn.recv(0, 3), lambda p: cmn.send(msg, p, 3)),
    }
    best = {name: (float("inf"), 0.0) for name in cases}
    for _ in range(3):
        for name, (waiter, sender) in cases.items():
            took, share = one_round(world, waiter, sender)
            shares = world.gather(share, root=0)
            if world.rank == 0:
                mean_share = float(np.mean([s for s in shares if s is not None]))
                if took < best[name][0]:
                    best[name] = (took, mean_share)
    if world.rank == 0:
        floor = best["idle waiters (floor)"][0]
        rows = [[name, f"{t:.3f}", f"{t / floor:.2f}x", f"{share * 100:.0f}%"]
                for name, (t, share) in best.items()]
        print(f"{world.size} ranks on {os.cpu_count()} cores: rank 0 computes, "
              f"{world.size - 1} ranks wait for it (best of 3 rounds)")
        print(table(["waiters use", "worker s", "vs floor", "waiter CPU"], rows))
    mn.finalize()


if __name__ == "__main__":
    main()
