"""One training job on 2 ranks with one fault injected: the fault matrix's subject.

::

    mpiexec -n 2 python tests/scripts/faults.py CONSTRUCT FAULT RANK

CONSTRUCT is how the model is split or trained (``CONSTRUCTS``); FAULT where
``FaultInjected`` is raised on rank RANK at iteration ``AT`` (``FAULTS``):
in a layer's forward, in a backward, in a trainer extension, in the
evaluator's forward, in the iterator. Every job runs under a chainer
``Trainer`` with the default fail-fast and timeout settings; without the
fault it would train ``ITERATIONS`` iterations and print "finished".
tests/test_fault_matrix.py runs it and times the end.
"""
import sys
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

import mnpar

AT = 3  # the iteration (0-based, while it runs) at which the fault fires
ITERATIONS = 8
CONSTRUCTS = ("chain_list", "gpipe", "1f1b", "zb1", "double_buffering", "spatial",
              "generic_evaluator")
FAULTS = ("forward", "backward", "extension", "evaluator", "iterator")


class FaultInjected(RuntimeError):
    pass


class Where:
    """Which fault fires on which rank, and the iteration the trainer is at."""

    def __init__(self, fault: str, rank: int, comm) -> None:
        self.fault, self.armed = fault, comm.rank == rank
        self.updater = None

    def due(self, fault: str) -> bool:
        return (self.fault == fault and self.armed and self.updater is not None
                and self.updater.iteration >= AT)

    def boom(self) -> None:
        sys.stderr.write(f"fault injected at {time.monotonic():.3f}\n")
        raise FaultInjected(f"boom on purpose ({self.fault})")


class BackwardFault(chainer.FunctionHook):
    """Raises in the backward of a function node, where and when the fault is due
    (a hook, not a function node of its own: a spatial model refuses unknown nodes)."""

    name = "fault-in-backward"

    def __init__(self, where: Where) -> None:
        self.where = where

    def backward_preprocess(self, function, in_data, out_grad):
        if self.where.due("backward"):
            self.where.boom()


class Fault(chainer.Link):
    """Passes its input on; raises where and when the fault is due."""

    def __init__(self, where: Where) -> None:
        super().__init__()
        self.where = where

    def forward(self, x):
        if chainer.config.train and self.where.due("forward"):
            self.where.boom()
        if not chainer.config.train and self.where.fault == "evaluator" and self.where.armed:
            self.where.boom()
        return x


class FaultyIterator(chainer.iterators.SerialIterator):
    def __init__(self, dataset, batch_size, where: Where, **kwargs) -> None:
        super().__init__(dataset, batch_size, **kwargs)
        self.where = where

    def __next__(self):
        if self.where.due("iterator"):
            self.where.boom()
        return super().__next__()

    next = __next__


def data(n=64, d=8, classes=4):
    rng = np.random.RandomState(0)
    x = rng.randn(n, d).astype(np.float32)
    t = rng.randint(0, classes, n).astype(np.int32)
    return chainer.datasets.TupleDataset(x, t)


def chain_list(comm, where):
    """ChainerMN's model-parallel MLP loop: rank 0 holds the data and the loss."""
    np.random.seed(0)
    model = mnpar.MultiNodeChainList(comm)
    ds = data()
    if comm.rank == 0:
        model.add_link(chainer.Sequential(L.Linear(8, 8), Fault(where)), rank_in=None,
                       rank_out=1)
        model.add_link(chainer.Sequential(Fault(where), L.Linear(8, 4)), rank_in=1,
                       rank_out=None)
        target = L.Classifier(model)
    else:
        model.add_link(chainer.Sequential(L.Linear(8, 8), Fault(where)), rank_in=0,
                       rank_out=0)
        target, ds = model, mnpar.datasets.create_empty_dataset(ds)
    optimizer = chainer.optimizers.SGD().setup(target)
    it = FaultyIterator(ds, 16, where)
    updater = chainer.training.StandardUpdater(it, optimizer)
    evaluator = chainer.training.extensions.Evaluator(
        chainer.iterators.SerialIterator(ds, 16, repeat=False, shuffle=False), target)
    return updater, evaluator


def pipeline(schedule):
    def build(comm, where):
        from mnpar.pipeline import PipelineEvaluator, PipelineUpdater, build_stage

        np.random.seed(0)
        model = chainer.Sequential(L.Linear(8, 8), Fault(where), L.Linear(8, 8), Fault(where),
                                   L.Linear(8, 4))
        stage = build_stage(model, [3, 2], comm)
        ds = data()
        target = L.Classifier(stage) if comm.rank == 0 else stage
        if comm.rank != 0:
            ds = mnpar.datasets.create_empty_dataset(ds)
        optimizer = chainer.optimizers.SGD().setup(target)
        updater = PipelineUpdater(FaultyIterator(ds, 16, where), optimizer, comm, 4,
                                  schedule=schedule)
        evaluator = PipelineEvaluator(
            chainer.iterators.SerialIterator(ds, 16, repeat=False, shuffle=False), target,
            comm, 4)
        return updater, evaluator
    return build


def data_parallel(comm, where, double_buffering=False):
    np.random.seed(0)
    target = L.Classifier(chainer.Sequential(L.Linear(8, 8), Fault(where), L.Linear(8, 4)))
    ds = mnpar.scatter_dataset(data() if comm.rank == 0 else None, comm, shuffle=True, seed=0)
    optimizer = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(), comm,
                                                  double_buffering=double_buffering)
    optimizer.setup(target)
    updater = chainer.training.StandardUpdater(FaultyIterator(ds, 8, where), optimizer)
    evaluator = mnpar.create_multi_node_evaluator(chainer.training.extensions.Evaluator(
        chainer.iterators.SerialIterator(ds, 8, repeat=False, shuffle=False), target), comm)
    return updater, evaluator


def spatial(comm, where):
    """A small CNN on a 1x2 grid: every rank holds one half of every image."""
    np.random.seed(0)
    grid = mnpar.spatial.SpatialGrid(comm, (1, 2))

    class Net(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.c1 = L.Convolution2D(1, 2, 3, pad=1)
                self.fault = Fault(where)
                self.c2 = L.Convolution2D(2, 1, 3, pad=1)

        def forward(self, x, t):
            y = self.c2(self.fault(F.relu(self.c1(x))))
            loss = mnpar.spatial.mean_squared_error(y, t, grid)
            chainer.report({"loss": loss}, self)
            return loss

    net = mnpar.spatial.convert(Net(), grid)
    rng = np.random.RandomState(1)
    x = rng.randn(32, 1, 8, 8).astype(np.float32)
    ds = mnpar.spatial.TiledDataset(chainer.datasets.TupleDataset(x, np.tanh(x)), grid,
                                    image=(0, 1))
    optimizer = chainer.optimizers.SGD().setup(net)
    updater = chainer.training.StandardUpdater(
        FaultyIterator(ds, 4, where, shuffle=False), optimizer)
    evaluator = chainer.training.extensions.Evaluator(
        chainer.iterators.SerialIterator(ds, 4, repeat=False, shuffle=False), net)
    return updater, evaluator


def generic_evaluator(comm, where):
    updater, _ = data_parallel(comm, where)
    target = updater.get_optimizer("main").target

    class Top1(mnpar.extensions.GenericMultiNodeEvaluator):
        def calc_local(self, x, t):
            with chainer.using_config("train", False):
                return int((target.predictor(x).array.argmax(axis=1) == t).sum())

        def aggregate(self, results):
            return sum(results)

    ds = mnpar.scatter_dataset(data() if comm.rank == 0 else None, comm, seed=0)
    return updater, Top1(comm, chainer.iterators.SerialIterator(ds, 8, repeat=False,
                                                                shuffle=False), target)


BUILD = {"chain_list": chain_list, "gpipe": pipeline("gpipe"), "1f1b": pipeline("1f1b"),
         "zb1": pipeline("zb1"), "double_buffering": lambda c, w: data_parallel(c, w, True),
         "spatial": spatial, "generic_evaluator": generic_evaluator}


def main():
    construct, fault, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    assert construct in CONSTRUCTS and fault in FAULTS, sys.argv
    comm = mnpar.create_communicator("naive")
    where = Where(fault, rank, comm)
    updater, evaluator = BUILD[construct](comm, where)
    where.updater = updater
    BackwardFault(where).__enter__()  # every backward of the job, through to its end
    trainer = chainer.training.Trainer(updater, (ITERATIONS, "iteration"))
    trainer.extend(evaluator, trigger=(AT, "iteration"))

    @chainer.training.make_extension(trigger=(1, "iteration"))
    def faulty_extension(trainer):
        if where.due("extension"):
            where.boom()
    trainer.extend(faulty_extension)
    trainer.run()
    print(f"rank {comm.rank}: finished", flush=True)


if __name__ == "__main__":
    main()
