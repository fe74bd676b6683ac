"""Model and data parallelism together: two model-parallel pairs, each a replica.

::

    world rank      0        1        2        3
    pair (mp)       0        0        1        1     l1 | l2, l3: activations cross the pair
    stage (dp)      0        1        0        1     gradients averaged over a stage

    mpiexec -n 4 python examples/dual_parallel/train_dual.py [--epochs 10] [--gpu]

A ``mnpar.Mesh`` names both axes: ``pipeline`` (the pair, its ranks side by
side) and ``data`` (the replicas); ``mesh.comm(axis)`` is each group. Stage 0
of every pair holds the first layer and the labels; stage 1 the rest. The
digits are scattered over the stage-0 ranks (``scatter_dataset`` on the
data-parallel group); each stage's optimizer is a multi-node optimizer over
its data-parallel group. Any even number of ranks works: ``N / 2`` pairs.
The training loss and accuracy rank 0 prints and logs are the means over the
pairs (``ObservationAggregator`` over the stage-0 ranks), what one process
logs for the whole update.
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

EXAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[1:1] = [EXAMPLES, os.path.join(EXAMPLES, "data_parallel")]
import common  # noqa: E402  what the examples share (examples/common.py)
from train_mlp import load_digits  # noqa: E402


class Stage0(chainer.Chain):
    """``x -> l1 -> relu``, sent to stage 1; the class scores come back."""

    def __init__(self, mp, n_units):
        super().__init__()
        self.mp = mp
        with self.init_scope():
            self.l1 = L.Linear(64, n_units)

    def forward(self, x):
        phi = mnpar.functions.send(F.relu(self.l1(x)), self.mp, rank=1)
        return mnpar.functions.recv(self.mp, rank=1, delegate_variable=phi)


class Stage1(chainer.Chain):
    """``l2 -> relu -> l3`` on what stage 0 sent; the scores go back."""

    def __init__(self, mp, n_units):
        super().__init__()
        self.mp = mp
        with self.init_scope():
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, 10)

    def forward(self, *_):  # the empty dataset calls it with no arguments
        h = mnpar.functions.recv(self.mp, rank=0)
        return mnpar.functions.send(self.l3(F.relu(self.l2(h))), self.mp, rank=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batchsize", type=int, default=32, help="examples per pair")
    parser.add_argument("--units", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="result/dual_parallel")
    common.add_gpu_option(parser)
    args = parser.parse_args()

    world = mnpar.create_communicator("naive")
    if world.size % 2:
        raise SystemExit(f"train_dual.py needs an even number of ranks, not {world.size}")
    mesh = mnpar.Mesh(world, data=-1, pipeline=2)
    mp = mesh.comm("pipeline")  # my pair: stage 0 and stage 1
    dp = mesh.comm("data")  # my stage in every pair
    device = common.device_of(world, args.gpu)
    np.random.seed(args.seed)  # every replica of a stage starts alike
    if mp.rank == 0:
        model = L.Classifier(Stage0(mp, args.units))
        train, valid = load_digits(args.seed) if dp.rank == 0 else (None, None)
        train = mnpar.scatter_dataset(train, dp, shuffle=True, seed=args.seed)
        valid = mnpar.scatter_dataset(valid, dp)
        mp.bcast_obj((len(train), len(valid)), root=0)
    else:
        model = Stage1(mp, args.units)
        n_train, n_valid = mp.bcast_obj(None, root=0)
        train = mnpar.datasets.create_empty_dataset(range(n_train))
        valid = mnpar.datasets.create_empty_dataset(range(n_valid))
    model.to_device(device)
    optimizer = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), dp)
    optimizer.setup(model)
    # The pair's two iterators must walk their datasets in step: no shuffling here
    # (scatter_dataset shuffled), the same batch size and length.
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize, shuffle=False)
    valid_iter = chainer.iterators.SerialIterator(valid, args.batchsize, repeat=False,
                                                  shuffle=False)
    updater = chainer.training.StandardUpdater(train_iter, optimizer, device=device)
    trainer = chainer.training.Trainer(updater, (args.epochs, "epoch"), out=args.out)
    trainer.extend(mnpar.create_multi_node_evaluator(
        extensions.Evaluator(valid_iter, model, device=device), dp))
    if mp.rank == 0:  # stage 0 computes the loss: its mean over the pairs is logged
        common.report_means(trainer, dp)
    if world.rank == 0:
        print(f"{world.size // 2} pairs x 2 stages ({device}), {len(train)} training examples "
              "per pair", flush=True)
        trainer.extend(extensions.LogReport())
        trainer.extend(common.print_report(
            ["epoch", "main/loss", "validation/main/loss", "main/accuracy",
             "validation/main/accuracy", "elapsed_time"]))
    trainer.run()
    mesh.free()
    world.finalize()


if __name__ == "__main__":
    main()
