"""The Python calls and files from ``mnpar.functions.send`` to MPI, counted.

Run with two ranks::

    mpiexec -n 2 python benchmarks/trace_send_path.py [--size 4096] [--calls]

Rank 0 sends a float32 array of ``--size`` bytes with ``functions.send`` to
rank 1, which receives it with ``functions.recv``; a first message warms
every path up. For the second, each rank traces (``sys.setprofile``) from the
entry into ``send``/``recv`` until the first MPI call that moves the data
(``Isend``/``Send``/``Issend``, or ``Irecv``/``Recv``/``Mrecv``/``Imrecv``),
and reports how many Python calls were made on the way, in how many files of
mnpar; ``--calls`` lists them. Then *the path*: mnpar's frames on the stack
at that MPI call, from the function node that hands the arrays to the
communicator (``Send.forward``, ``Recv.forward``) down, each a call of the
one before it: the hops docs/internals.rst lists. It measures the structure
of one path, not its speed: ``bench_p2p`` times it.
"""
import argparse
import os
import sys
import traceback
from collections import Counter

import numpy as np

import mnpar

ROOT = os.path.dirname(os.path.abspath(mnpar.__file__))
SENDS = {"Isend", "Send", "Issend", "Ssend"}
# On the communicator, a probed message, or the persistent receive of a (source, tag).
RECEIVES = {"Irecv", "Recv", "irecv", "recv", "Start"}


class _Spy:
    """Forwards to an MPI object; notes the first call of a name in ``stops``.

    mpi4py's methods are Cython functions, which ``sys.setprofile`` does not
    report, so the transport's communicator and its persistent receives are
    wrapped for the traced message.
    """

    def __init__(self, real, stops, stopped):
        self._real, self._stops, self._stopped = real, stops, stopped

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if name in self._stops and not self._stopped:
                self._stopped.append(name)
                self._stopped.append(traceback.extract_stack()[:-1])  # the path to here
            out = attr(*args, **kwargs)
            if name.lower() in ("improbe", "mprobe") and out is not None:
                return _Spy(out, self._stops, self._stopped)  # the message receives the data
            return out

        return call

    def __bool__(self):
        return bool(self._real)


def traced(comm, fn, stops):
    """Runs ``fn``; returns the Python calls made before the first MPI call in ``stops``."""
    calls = []
    stopped = []

    def profile(frame, event, arg):
        if event == "call" and not stopped:
            calls.append((frame.f_code.co_filename, frame.f_code.co_name, frame.f_lineno))

    transport = comm._t  # its communicator, its outbox's, and each route's first receive
    real = transport.comm
    transport.comm = transport.outbox.comm = _Spy(real, stops, stopped)
    routes = transport.routes.table.values()
    for route in routes:
        route.first = route.first and _Spy(route.first, stops, stopped)
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        transport.comm = transport.outbox.comm = real
        for route in routes:
            route.first = getattr(route.first, "_real", route.first)
    return calls, (stopped[0] if stopped else None), (stopped[1] if stopped else [])


def hops_of(stack, entry):
    """mnpar's frames of ``stack`` from the innermost call of ``entry`` (a function
    name) down: ``file:line function`` each, the MPI call last."""
    frames = [f for f in stack if f.filename.startswith(ROOT)]
    starts = [i for i, f in enumerate(frames) if f.name == entry]
    return frames[starts[-1]:] if starts else frames


def report(name, calls, stop, show, stack=(), entry="forward"):
    ours = [c for c in calls if c[0].startswith(ROOT)]
    files = Counter(os.path.relpath(c[0], os.path.dirname(ROOT)) for c in ours)
    print(f"{name} -> {stop}: {len(ours)} calls in {len(files)} files of mnpar "
          f"({len(calls)} Python calls in all)")
    for path, count in files.most_common():
        print(f"    {count:3d}  {path}")
    if show:
        for filename, function, line in ours:
            print(f"        {os.path.relpath(filename, os.path.dirname(ROOT))}:{line} {function}")
    hops = hops_of(stack, entry)
    modules = {f.filename for f in hops}
    print(f"  the path, from {entry} to {stop}: {len(hops)} calls in {len(modules)} modules")
    for f in hops:
        print(f"    {os.path.relpath(f.filename, os.path.dirname(ROOT))}:{f.lineno} {f.name}")
    print(f"    MPI {stop}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096, help="message bytes (default 4096)")
    parser.add_argument("--calls", action="store_true", help="list every call")
    args = parser.parse_args()
    comm = mnpar.create_communicator("naive")
    if comm.size != 2:
        raise SystemExit("run with mpiexec -n 2")
    x = np.arange(args.size // 4, dtype=np.float32)
    for _ in range(2):  # the first message warms every path up
        if comm.rank == 0:
            calls, stop, stack = traced(comm, lambda: mnpar.functions.send(x, comm, rank=1),
                                        SENDS)
        else:
            calls, stop, stack = traced(comm, lambda: mnpar.functions.recv(comm, rank=0),
                                        RECEIVES)
        comm.mpi_comm.Barrier()
    for rank in range(2):
        if rank == comm.rank:
            report("functions.send" if rank == 0 else "functions.recv", calls, stop, args.calls,
                   stack)
            sys.stdout.flush()
        comm.mpi_comm.Barrier()
    comm.finalize()


if __name__ == "__main__":
    main()
