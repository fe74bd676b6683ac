"""Example 1 of the tutorial: an MLP split over two ranks, trained with a Trainer.

Run it with two ranks (``make demo`` runs the defaults)::

    mpiexec -n 2 python examples/mlp/train_mlp.py [--model send-recv|chain-list]
                                                  [--dataset digits|mnist] [--gpu]

Rank 0 holds the first layer and the loss, rank 1 the other two layers and an
empty dataset. Rank 0 logs, prints and plots into ``--out``; at the end every
rank saves its part of the model as ``OUT/model_rank{R}.npz``. With
``--snapshot-interval`` every rank snapshots its trainer; ``--resume auto``
continues from the newest snapshot that both ranks wrote, and the result
equals, bit for bit, that of a run never interrupted.
"""
import argparse
import os
import random
import sys
import time

import chainer
import numpy as np
from chainer.training import extensions

import mnpar

# isort: split
import data  # this example's own modules, beside this script
import models

N_RANKS = 2


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=models.STYLES, default="send-recv",
                        help="explicit send/recv, or MultiNodeChainList (default send-recv)")
    parser.add_argument("--dataset", choices=data.DATASETS, default="digits",
                        help="digits: scikit-learn's, bundled; mnist: downloads (default digits)")
    parser.add_argument("--gpu", action="store_true",
                        help="one GPU per rank (comm.intra_rank), 'hierarchical' communicator")
    parser.add_argument("--communicator", choices=mnpar.communicators.NAMES, default=None,
                        help="override the communicator (default: naive, hierarchical with --gpu)")
    parser.add_argument("--epoch", "-e", type=int, default=20, help="epochs (default 20)")
    parser.add_argument("--batchsize", "-b", type=int, default=32, help="default 32")
    parser.add_argument("--unit", "-u", type=int, default=100, help="hidden units (default 100)")
    parser.add_argument("--out", "-o", default=os.path.join("result", "mlp"),
                        help="output directory (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds weights and shuffling: same seed, same result (default 0)")
    parser.add_argument("--snapshot-interval", type=int, default=None, metavar="N",
                        help="snapshot every N iterations (default: every epoch; 0: never)")
    parser.add_argument("--resume", default=None, metavar="auto|PATH",
                        help="auto: the newest snapshot in --out that every rank wrote; a "
                             "directory: the same there; a snapshot file (any rank's): that "
                             "iteration")
    args = parser.parse_args(argv)
    for name in ("epoch", "batchsize", "unit"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.seed < 0:
        parser.error(f"--seed must be 0 or more, not {args.seed}")
    if args.snapshot_interval is not None and args.snapshot_interval < 0:
        parser.error(f"--snapshot-interval must be 0 or more, not {args.snapshot_interval}")
    return args


def seed_everything(seed, gpu):
    """Seeds every generator the run draws from: weights come from numpy's."""
    random.seed(seed)
    np.random.seed(seed)
    if gpu:
        import cupy

        cupy.random.seed(seed)


def datasets(comm, name):
    """Rank 0 loads the data; rank 1 gets empty datasets of the same lengths."""
    if comm.rank == 0:
        train, test = data.load(name)
        n_in = train[0][0].size
        comm.bcast_obj((len(train), len(test), n_in))
        return train, test, n_in
    n_train, n_test, n_in = comm.bcast_obj(None)
    return (mnpar.datasets.create_empty_dataset(range(n_train)),
            mnpar.datasets.create_empty_dataset(range(n_test)), n_in)


def add_reporting(trainer):
    """Logs, prints and plots on rank 0; returns the plot files made."""
    trainer.extend(extensions.LogReport())
    tty = sys.stdout.isatty()
    trainer.extend(extensions.PrintReport(
        ["epoch", "main/loss", "validation/main/loss", "main/accuracy",
         "validation/main/accuracy", "elapsed_time"], out=sys.stdout if tty else PlainText(
            sys.stdout)))
    if tty:
        trainer.extend(extensions.ProgressBar())
    if not extensions.PlotReport.available():
        print("matplotlib is missing: no plots (pip install matplotlib)")
        return []
    import matplotlib

    matplotlib.use("Agg")
    for key, name in (("loss", "loss.png"), ("accuracy", "accuracy.png")):
        trainer.extend(extensions.PlotReport([f"main/{key}", f"validation/main/{key}"],
                                             x_key="epoch", filename=name))
    return ["loss.png", "accuracy.png"]


class PlainText:
    """A stream without PrintReport's terminal codes, for logs that are not a terminal."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        self.stream.write(text.replace("\033[J", ""))
        self.stream.flush()

    def flush(self):
        self.stream.flush()


def main(argv=None):
    args = parse_args(argv)
    name = args.communicator or ("hierarchical" if args.gpu else "naive")
    comm = mnpar.create_communicator(name)
    if comm.size != N_RANKS:
        if comm.rank == 0:
            print(f"error: train_mlp.py splits the model over exactly {N_RANKS} ranks, but "
                  f"it runs on {comm.size}; launch it as: mpiexec -n {N_RANKS} python "
                  f"{sys.argv[0]}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    device = chainer.get_device(f"@cupy:{comm.intra_rank}" if args.gpu else "@numpy")
    device.use()
    seed_everything(args.seed, args.gpu)

    train, test, n_in = datasets(comm, args.dataset)
    model = models.build(args.model, comm, n_in, args.unit, data.N_CLASSES)
    model.to_device(device)
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    train_iter = chainer.iterators.SerialIterator(
        train, args.batchsize,
        order_sampler=mnpar.extensions.ResumableShuffleOrderSampler(args.seed))
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize, repeat=False,
                                                 shuffle=False)
    updater = chainer.training.StandardUpdater(train_iter, optimizer, device=device)
    trainer = chainer.training.Trainer(updater, (args.epoch, "epoch"), out=args.out)
    # Both ranks evaluate: rank 0's evaluation waits for rank 1's layers.
    trainer.extend(extensions.Evaluator(test_iter, model, device=device))
    if args.snapshot_interval != 0:
        trigger = ((args.snapshot_interval, "iteration") if args.snapshot_interval
                   else (1, "epoch"))
        trainer.extend(mnpar.extensions.snapshot(comm, trigger=trigger))
    plots = add_reporting(trainer) if comm.rank == 0 else []

    resumed = None
    if args.resume is not None:  # every rank loads its own file of the same iteration
        resumed = mnpar.extensions.resume(
            comm, trainer, args.out if args.resume == "auto" else args.resume)
    if comm.rank == 0:
        print(f"{args.model} MLP on {args.dataset} over {comm.size} ranks ({name} "
              f"communicator, {device}); "
              + (f"resumed from iteration {resumed}" if resumed is not None
                 else "starting from iteration 0"), flush=True)
    trainer.run()

    path = os.path.join(args.out, f"model_rank{comm.rank}.npz")
    chainer.serializers.save_npz(path, model)
    comm.gather_obj(path)  # every rank has saved before rank 0 reports
    if comm.rank == 0:
        report(trainer, args.out, plots, time.perf_counter() - start)
    comm.finalize()
    return 0


def report(trainer, out, plots, seconds):
    log = trainer.get_extension("LogReport").log
    accuracy = log[-1].get("validation/main/accuracy") if log else None
    if accuracy is not None:
        print(f"validation accuracy {float(accuracy):.4f} after {log[-1]['epoch']} epochs, "
              f"{seconds:.1f} s")
    print(f"log:    {os.path.join(out, 'log')}")
    for name in plots:
        print(f"plot:   {os.path.join(out, name)}")
    print(f"models: {os.path.join(out, 'model_rank{0,1}.npz')}")


if __name__ == "__main__":
    sys.exit(main())
