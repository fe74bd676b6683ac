"""A deep MLP on scikit-learn's digits, pipelined over N ranks.

::

    mpiexec -n 2 python examples/pipeline/train_pipeline.py [--schedule 1f1b|gpipe|zb1|zb2]
        [--microbatches 4] [--balance auto|4,4] [--epochs 5] [--checkpoint never]
        [--iterations N] [--out result/pipeline] [--gpu]

Every rank builds the same ``chainer.Sequential`` and keeps its layers
(``build_stage``, the seed MLP's loop: rank 0 holds the data and the loss).
``--balance auto`` profiles the layers on rank 0 (``balance_by_time``).
Rank 0 prints the training and validation loss and accuracy each epoch
and writes them to ``OUT/log``; ``--iterations`` stops early (a quick run).
With ``--gpu`` every rank's stage runs on its GPU (activations and gradients
cross through host memory) and rank 0 sends each batch to its GPU.
"""
import argparse
import os
import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer.training import extensions

import mnpar
from mnpar.pipeline import PipelineEvaluator, PipelineUpdater, balance_by_time, build_stage

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402  what the examples share (examples/common.py)


def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    t = d.target.astype(np.int32)
    order = np.random.RandomState(0).permutation(len(x))
    val, train = order[:360], order[360:]
    return (chainer.datasets.TupleDataset(x[train], t[train]),
            chainer.datasets.TupleDataset(x[val], t[val]))


def deep_mlp(units, layers):
    np.random.seed(0)
    parts = []
    for i in range(layers):
        parts.append(L.Linear(None if i == 0 else units, 10 if i == layers - 1 else units))
        if i < layers - 1:
            parts.append(F.relu)
    return chainer.Sequential(*parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedule", choices=("1f1b", "gpipe", "zb1", "zb2"), default="1f1b",
                        help="docs/pipeline.rst compares them")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--balance", default="auto", help="'auto' or layers per rank, e.g. 8,7")
    parser.add_argument("--checkpoint", choices=("never", "except_last", "always"),
                        default="never")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=0,
                        help="stop after this many updates (0: after --epochs)")
    parser.add_argument("--out", default="result/pipeline", help="where rank 0 writes its log")
    parser.add_argument("--batchsize", type=int, default=64)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    common.add_gpu_option(parser)
    args = parser.parse_args()
    comm = mnpar.create_communicator(timeout=120)
    device = common.device_of(comm, args.gpu)
    train, val = digits()
    model = deep_mlp(args.units, args.layers)
    sample = np.stack([x for x, _ in train[:args.batchsize]])
    model(sample[:2])  # infers the first layer's input size
    model.to_device(device)
    sample = device.send(sample)  # balance_by_time profiles the layers where they run
    if args.balance == "auto":
        balance = balance_by_time(comm.size, model, sample, comm=comm)
    else:
        balance = [int(b) for b in args.balance.split(",")]
    stage = build_stage(model, balance, comm)
    target = L.Classifier(stage) if comm.rank == 0 else stage
    if comm.rank != 0:
        train = mnpar.datasets.create_empty_dataset(train)
        val = mnpar.datasets.create_empty_dataset(val)
    optimizer = chainer.optimizers.Adam().setup(target)
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    val_iter = chainer.iterators.SerialIterator(val, args.batchsize, repeat=False,
                                                shuffle=False)
    feed = device if comm.rank == 0 else None  # the rank that takes the input
    updater = PipelineUpdater(train_iter, optimizer, comm, args.microbatches,
                              schedule=args.schedule, checkpoint=args.checkpoint, device=feed)
    stop = (args.iterations, "iteration") if args.iterations else (args.epochs, "epoch")
    trainer = chainer.training.Trainer(updater, stop, out=args.out)
    trainer.extend(PipelineEvaluator(val_iter, target, comm, args.microbatches, device=feed))
    if comm.rank == 0:
        print(f"balance {balance} (layers and functions per rank), schedule {args.schedule}, "
              f"{args.microbatches} micro-batches, {device}", flush=True)
        trainer.extend(extensions.LogReport())
        trainer.extend(common.print_report(
            ["epoch", "main/loss", "main/accuracy", "validation/main/loss",
             "validation/main/accuracy", "elapsed_time"]))
    trainer.run()
    comm.finalize()


if __name__ == "__main__":
    main()
