"""The tutorial's MLP trained data-parallel over N ranks on scikit-learn's digits.

Every rank holds the whole model; rank 0 loads the data and scatters it, each
rank trains on its shard, and the multi-node optimizer averages the
gradients before every update::

    mpiexec -n 4 python examples/data_parallel/train_mlp.py [--epochs 10] [--gpu]

The batch size is per rank: N ranks train on N x ``--batchsize`` examples
per update. The training loss and accuracy rank 0 prints and logs are the
means over every rank's batch (``ObservationAggregator``), what one process
training on the whole update's examples logs; validation runs on every
rank's shard and is averaged.
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

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402  what the examples share (examples/common.py)


class MLP(chainer.Chain):
    def __init__(self, n_in: int, n_units: int, n_out: int) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(n_in, n_units)
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, n_out)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


def load_digits(seed: int):
    """``(train, validation)``: 1437 and 360 of the 1797 8x8 digits, in [0, 1]."""
    from sklearn.datasets import load_digits as sk_digits

    digits = sk_digits()
    x = (digits.data / 16.0).astype(np.float32)
    t = digits.target.astype(np.int32)
    order = np.random.RandomState(seed).permutation(len(x))
    x, t = x[order], t[order]
    return (chainer.datasets.TupleDataset(x[360:], t[360:]),
            chainer.datasets.TupleDataset(x[:360], t[:360]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batchsize", type=int, default=32, help="examples per rank")
    parser.add_argument("--units", type=int, default=100)
    parser.add_argument("--communicator", default="hierarchical",
                        help="how gradients are averaged (default %(default)s; pure_nccl needs "
                             "--gpu and a GPU per rank)")
    parser.add_argument("--double-buffering", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="result/data_parallel")
    common.add_gpu_option(parser)
    args = parser.parse_args()

    comm = mnpar.create_communicator(args.communicator)
    device = common.device_of(comm, args.gpu)
    np.random.seed(args.seed)  # every rank starts from the same weights
    model = L.Classifier(MLP(64, args.units, 10))  # 8x8 pixels in, 10 classes out
    model.to_device(device)
    optimizer = mnpar.create_multi_node_optimizer(
        chainer.optimizers.Adam(), comm, double_buffering=args.double_buffering)
    optimizer.setup(model)

    train, valid = load_digits(args.seed) if comm.rank == 0 else (None, None)
    train = mnpar.scatter_dataset(train, comm, shuffle=True, seed=args.seed)
    valid = mnpar.scatter_dataset(valid, comm, force_equal_length=False)
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    valid_iter = chainer.iterators.SerialIterator(valid, args.batchsize, repeat=False,
                                                  shuffle=False)
    updater = chainer.training.StandardUpdater(train_iter, optimizer, device=device)
    trainer = chainer.training.Trainer(updater, (args.epochs, "epoch"), out=args.out)
    evaluator = extensions.Evaluator(valid_iter, model, device=device)
    trainer.extend(mnpar.create_multi_node_evaluator(evaluator, comm))
    common.report_means(trainer, comm)  # on every rank: it is collective
    if comm.rank == 0:
        print(f"{comm.size} ranks ({comm.name}, {device}), {args.batchsize} examples per rank "
              f"and update, {len(train)} training examples per rank", flush=True)
        trainer.extend(extensions.LogReport())
        trainer.extend(common.print_report(
            ["epoch", "main/loss", "validation/main/loss", "main/accuracy",
             "validation/main/accuracy", "elapsed_time"]))
    trainer.run()
    comm.finalize()


if __name__ == "__main__":
    main()
