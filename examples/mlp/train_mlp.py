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
import sys
import time

import chainer
from chainer.training import extensions

import mnpar

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# isort: split
import common  # noqa: E402  what the examples share (examples/common.py)
import data  # noqa: E402  this example's own modules, beside this script
import models  # noqa: E402

N_RANKS = 2


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=models.STYLES, default="send-recv",
                        help="explicit send/recv, or MultiNodeChainList (default send-recv)")
    parser.add_argument("--dataset", choices=data.DATASETS, default="digits",
                        help="digits: scikit-learn's, bundled; mnist: downloads (default digits)")
    parser.add_argument("--epoch", "-e", type=int, default=20, help="epochs (default 20)")
    parser.add_argument("--batchsize", "-b", type=int, default=32, help="default 32")
    parser.add_argument("--unit", "-u", type=int, default=100, help="hidden units (default 100)")
    parser.add_argument("--out", "-o", default=os.path.join("result", "mlp"),
                        help="output directory (default %(default)s)")
    common.add_run_options(parser)
    args = parser.parse_args(argv)
    common.check_options(parser, args, ("epoch", "batchsize", "unit"))
    return args


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


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    comm, device = common.start(args, N_RANKS, "train_mlp.py", "splits the model over")
    if comm is None:
        return 2

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
    common.add_snapshots(comm, trainer, args)
    plots = []
    if comm.rank == 0:
        plots = common.add_reporting(
            trainer, ["epoch", "main/loss", "validation/main/loss", "main/accuracy",
                      "validation/main/accuracy", "elapsed_time"],
            {"loss.png": ["main/loss", "validation/main/loss"],
             "accuracy.png": ["main/accuracy", "validation/main/accuracy"]})
    resumed = common.resume(comm, trainer, args)
    if comm.rank == 0:
        print(f"{args.model} MLP on {args.dataset} over {comm.size} ranks ({comm.name} "
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
