"""Losses of chainer's own small training loops and of mnpar's examples, as JSON.

Run under two interpreters (numpy 2 and numpy 1.26) by
``tests/test_compat_chainer.py``, which compares the two outputs: the
compatibility layer is right where both train alike.

Usage: ``python tests/scripts/numpy_losses.py OUT_DIR``; prints one JSON object.
"""
import json
import os
import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training
from chainer.training import extensions

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from test_examples_mlp import ROOT, log_of, run  # noqa: E402 - the suite's launcher

STEPS = 6


def cnn():
    """Convolution, batch norm, pooling, linear and Adam on fixed random images."""
    rng = np.random.RandomState(0)
    x = rng.randn(16, 1, 8, 8).astype(np.float32)
    t = rng.randint(0, 3, 16).astype(np.int32)
    np.random.seed(0)
    model = chainer.Sequential(L.Convolution2D(1, 4, 3, pad=1), L.BatchNormalization(4),
                               F.relu, lambda h: F.max_pooling_2d(h, 2), L.Linear(None, 3))
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    losses = []
    for _ in range(STEPS):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        optimizer.update()
        losses.append(float(loss.array))
    with chainer.using_config("train", False):
        losses.append(float(F.softmax_cross_entropy(model(x), t).array))  # BN's running stats
    return losses


def lstm():
    """An NStepLSTM on sequences of three lengths, trained by momentum SGD."""
    rng = np.random.RandomState(1)
    xs = [rng.randn(n, 3).astype(np.float32) for n in (5, 3, 1)]
    ts = [rng.randn(n, 4).astype(np.float32) for n in (5, 3, 1)]
    np.random.seed(1)
    model = L.NStepLSTM(2, 3, 4, dropout=0.0)
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1)
    optimizer.setup(model)
    losses = []
    for _ in range(STEPS):
        _, _, ys = model(None, None, xs)
        loss = sum(F.mean_squared_error(y, t) for y, t in zip(ys, ts))
        model.cleargrads()
        loss.backward()
        optimizer.update()
        losses.append(float(loss.array))
    return losses


def trainer_run(out, epochs, resume=None):
    """A Trainer with LogReport and snapshots; returns its logged losses."""
    rng = np.random.RandomState(2)
    x = rng.randn(64, 5).astype(np.float32)
    y = (x @ rng.randn(5, 1)).astype(np.float32)
    np.random.seed(2)
    model = L.Classifier(L.Linear(5, 1), lossfun=F.mean_squared_error)
    model.compute_accuracy = False
    optimizer = chainer.optimizers.MomentumSGD(lr=0.05)
    optimizer.setup(model)
    it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, y), 16,
                                          shuffle=True)
    it.order_sampler = chainer.iterators.ShuffleOrderSampler(np.random.RandomState(3))
    trainer = training.Trainer(training.updaters.StandardUpdater(it, optimizer),
                               (epochs, "epoch"), out=out)
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.snapshot(filename="snapshot_{.updater.epoch}"),
                   trigger=(1, "epoch"))
    if resume:
        chainer.serializers.load_npz(os.path.join(out, resume), trainer)
    trainer.run()
    return [entry["main/loss"] for entry in trainer.get_extension("LogReport").log]


def example(script, n, args, out):
    """Runs one of mnpar's examples under mpiexec, as the suite does; returns its losses."""
    run([*args, "--out", out], n=n, script=os.path.join(ROOT, script))
    return [[entry[k] for k in sorted(entry) if k.endswith("loss")] for entry in log_of(out)]


def main(out):
    found = {"numpy": np.__version__, "cnn": cnn(), "lstm": lstm(),
             "trainer": trainer_run(os.path.join(out, "trainer"), 3)}
    # Resumed from epoch 2's snapshot, the third epoch logs what it logged unbroken.
    found["resumed"] = trainer_run(os.path.join(out, "trainer"), 3, resume="snapshot_2")
    found["mlp"] = example("examples/mlp/train_mlp.py", 2,
                           ["--epoch", "2", "--unit", "32"], os.path.join(out, "mlp"))
    found["seq2seq"] = example("examples/seq2seq/train_seq2seq.py", 2,
                               ["--toy-pairs", "320", "--epoch", "1", "--unit", "32", "--seed",
                                "2", "--max-length", "12"], os.path.join(out, "seq2seq"))
    found["pipeline"] = example("examples/pipeline/train_pipeline.py", 2,
                                ["--epochs", "1", "--units", "32", "--microbatches", "4"],
                                os.path.join(out, "pipeline"))
    print(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1])
