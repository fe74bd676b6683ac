"""What the model-parallel examples share: options, seeding, reporting.

The examples put this folder on ``sys.path`` and ``import common``; the rest
of each example (its model, its data, its wiring) stays in its own folder.
"""
import os
import random
import socket
import sys

import chainer
import numpy as np
from chainer.training import extensions

import mnpar


def add_run_options(parser):
    """Options every example takes: device, communicator, seed, snapshots, resume."""
    parser.add_argument("--gpu", action="store_true",
                        help="one GPU per rank (comm.intra_rank), 'hierarchical' communicator")
    parser.add_argument("--communicator", choices=mnpar.communicators.NAMES, default=None,
                        help="override the communicator (default: naive, hierarchical with --gpu)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds weights and shuffling: same seed, same result (default 0)")
    parser.add_argument("--snapshot-interval", type=int, default=None, metavar="N",
                        help="snapshot every N iterations (default: every epoch; 0: never)")
    parser.add_argument("--resume", default=None, metavar="auto|PATH",
                        help="auto: the newest snapshot in --out that every rank wrote; a "
                             "directory: the same there; a snapshot file (any rank's): that "
                             "iteration")


def check_options(parser, args, positive):
    """Rejects, through ``parser.error``, options out of range; ``positive``: names >= 1."""
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not "
                         f"{getattr(args, name)}")
    if args.seed < 0:
        parser.error(f"--seed must be 0 or more, not {args.seed}")
    if args.snapshot_interval is not None and args.snapshot_interval < 0:
        parser.error(f"--snapshot-interval must be 0 or more, not {args.snapshot_interval}")
    if "{host}" in getattr(args, "out", ""):  # a directory per host: snapshots stay local
        args.out = args.out.replace("{host}", host_name())


def host_name():
    """This rank's host: ``MNPAR_HOST_NAME`` where set (test hosts), else the machine's."""
    return os.environ.get("MNPAR_HOST_NAME") or socket.gethostname()


def start(args, n_ranks, script, layout):
    """The communicator and the device, or ``None`` (after saying why) on a wrong rank count.

    ``layout`` says in words what the example puts on its ``n_ranks`` ranks.
    """
    name = args.communicator or ("hierarchical" if args.gpu else "naive")
    comm = mnpar.create_communicator(name)
    if comm.size != n_ranks:
        if comm.rank == 0:
            print(f"error: {script} {layout} exactly {n_ranks} ranks, but it runs on "
                  f"{comm.size}; launch it as: mpiexec -n {n_ranks} python {sys.argv[0]}",
                  file=sys.stderr)
        return None, None
    device = chainer.get_device(f"@cupy:{gpu_of(comm)}" if args.gpu else "@numpy")
    device.use()
    reseed(args.seed, args.gpu)
    return comm, device


def gpu_of(comm):
    """This rank's GPU: ``intra_rank``, shared round robin where a node has fewer GPUs than ranks.

    Sharing works for send/recv (each rank has its own CUDA context) but not for NCCL, which
    wants one rank per device: ``pure_nccl`` says so when it is asked for.
    """
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if count < comm.intra_size and comm.intra_rank == 0:
        print(f"note: {comm.intra_size} ranks share this node's {count} GPU(s)", file=sys.stderr)
    return comm.intra_rank % count


def reseed(seed, gpu):
    """Seeds every generator the run draws from: weights and dropout masks use numpy's."""
    random.seed(seed)
    np.random.seed(seed)
    if gpu:
        import cupy

        cupy.random.seed(seed)


def add_snapshots(comm, trainer, args):
    """Every rank snapshots as ``--snapshot-interval`` says (default: every epoch)."""
    if args.snapshot_interval != 0:
        trigger = ((args.snapshot_interval, "iteration") if args.snapshot_interval
                   else (1, "epoch"))
        trainer.extend(mnpar.extensions.snapshot(comm, trigger=trigger))


def resume(comm, trainer, args):
    """Resumes as ``--resume`` says; returns the iteration resumed from, or ``None``.

    Every rank loads its own file of the same iteration.
    """
    if args.resume is None:
        return None
    # auto: the trainer's own directory (``--out``), where no snapshot means a fresh start;
    # a path must exist.
    return mnpar.extensions.resume(comm, trainer, None if args.resume == "auto" else args.resume)


def add_reporting(trainer, columns, plots):
    """Logs and prints ``columns``; plots ``{file name: keys}``. Returns the plots made."""
    trainer.extend(extensions.LogReport())
    tty = sys.stdout.isatty()
    trainer.extend(extensions.PrintReport(
        columns, out=sys.stdout if tty else PlainText(sys.stdout)))
    if tty:
        trainer.extend(extensions.ProgressBar())
    if not extensions.PlotReport.available():
        print("matplotlib is missing: no plots (pip install matplotlib)")
        return []
    import matplotlib

    matplotlib.use("Agg")
    for name, keys in plots.items():
        trainer.extend(extensions.PlotReport(keys, x_key="epoch", filename=name))
    return list(plots)


class PlainText:
    """A stream without PrintReport's terminal codes, for logs that are not a terminal."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        self.stream.write(text.replace("\033[J", ""))
        self.stream.flush()

    def flush(self):
        self.stream.flush()
