"""What the model-parallel examples share: options, seeding, reporting.

The examples put this folder on ``sys.path`` and ``import common``; the rest
of each example (its model, its data, its wiring) stays in its own folder.
"""
import argparse
import os
import random
import socket
import sys

import chainer
import numpy as np
from chainer.training import extensions

import mnpar

GPU_HELP = ("run on GPUs (needs cupy): rank r of a node takes GPU r, shared round robin "
            "where the node has fewer GPUs than ranks")


def parse_grid(text):
    """``--grid RxC`` of the spatial examples: ``(R, C)``, both at least 1."""
    try:
        shape = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 2 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not ROWSxCOLUMNS, e.g. 1x2 or 2x2")
    return shape


def add_gpu_option(parser, note=""):
    """``--gpu``: every example takes it; ``note`` adds what else it changes."""
    parser.add_argument("--gpu", action="store_true", help=GPU_HELP + (f"; {note}" if note
                                                                       else ""))


def add_run_options(parser):
    """Options the tutorial's examples take: device, communicator, seed, snapshots, resume."""
    add_gpu_option(parser, "'hierarchical' communicator")
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
    device = device_of(comm, args.gpu)
    reseed(args.seed, args.gpu)
    return comm, device


def device_of(comm, gpu, count=None):
    """This rank's chainer device, made current: with ``gpu`` its GPU (``gpu_of``), else the
    CPU."""
    device = chainer.get_device(f"@cupy:{gpu_of(comm, count)}" if gpu else "@numpy")
    device.use()
    return device


def gpu_of(comm, count=None):
    """This rank's GPU: ``mnpar.communicators.gpu_index`` (``intra_rank`` modulo ``count``),
    shared round robin where a node has fewer GPUs than ranks.

    ``count`` is the node's GPUs (default: cupy's count). Sharing works for send/recv and
    the host-staged collectives (each rank has its own CUDA context) but not for NCCL, which
    wants one rank per device: ``pure_nccl`` says so when it is asked for.
    """
    if count is None:
        try:
            import cupy
        except ImportError as error:
            raise RuntimeError(f"--gpu needs cupy ({error}); install the cupy wheel of your "
                               "CUDA (docs/installation.rst, GPUs), or leave out --gpu") from None
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as error:  # cudaErrorNoDevice, a driver too old for this cupy
            raise RuntimeError(f"--gpu: cupy finds no CUDA device on this node ({error}); "
                               "leave out --gpu to run on the CPU") from None
    if count < 1:
        raise RuntimeError("--gpu: cupy sees no CUDA device on this node; leave out --gpu to "
                           "run on the CPU")
    if count < comm.intra_size and comm.intra_rank == 0:
        print(f"note: {comm.intra_size} ranks share this node's {count} GPU(s)", file=sys.stderr)
    return mnpar.communicators.gpu_index(comm, count)


def report_means(trainer, comm, keys=("main/loss", "main/accuracy")):
    """Reports each of ``keys`` as its mean over the ranks of ``comm``, not this rank's own.

    chainer's reporter is per process, so rank 0's log would show its own batch alone; every
    rank adds this (it is collective), and with equal batches the mean over the ranks is the
    mean over the update's examples, what one process logs.
    """
    for key in keys:
        trainer.extend(mnpar.extensions.ObservationAggregator(comm, key))


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
    trainer.extend(print_report(columns))
    if sys.stdout.isatty():
        trainer.extend(extensions.ProgressBar())
    if not extensions.PlotReport.available():
        print("matplotlib is missing: no plots (pip install matplotlib)")
        return []
    import matplotlib

    matplotlib.use("Agg")
    for name, keys in plots.items():
        trainer.extend(extensions.PlotReport(keys, x_key="epoch", filename=name))
    return list(plots)


def print_report(columns, **kwargs):
    """chainer's PrintReport of ``columns`` on stdout, without terminal codes unless a terminal."""
    out = sys.stdout if sys.stdout.isatty() else PlainText(sys.stdout)
    return extensions.PrintReport(columns, out=out, **kwargs)


class PlainText:
    """A stream without PrintReport's terminal codes, for logs that are not a terminal."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        self.stream.write(text.replace("\033[J", ""))
        self.stream.flush()

    def flush(self):
        self.stream.flush()
