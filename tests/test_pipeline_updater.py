"""PipelineUpdater and PipelineEvaluator: transparency, bad input, Trainer.

After one update every rank's parameters equal those of the same
MultiNodeChainList trained without pipelining and those of the whole model
in one process (float64, same seeded weights). Ranks past the model's hold
an empty MultiNodeChainList and take part in every collective.
"""
import json
import re

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from helpers import Dense, Identity, float64, unpipelined

import mnpar
from mnpar.pipeline import PipelineEvaluator, PipelineUpdater
from mnpar.pipeline._schedule import TRAINING_SCHEDULES

BATCH = 10  # not divisible by 3 or 8


@pytest.fixture(scope="module")
def comm():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


def layers(topology):
    """The whole model's parts, seeded: the same weights on every call."""
    np.random.seed(7)
    if topology == "loop":
        parts = [Dense(6, 8), Dense(8, 4, relu=False)]
    else:
        parts = [Dense(6, 8), Dense(8, 8), Dense(8, 4, relu=False)]
    for p in parts:
        p.to_device("@numpy")
    return [float64(p) for p in parts]


def data():
    rng = np.random.RandomState(3)
    return rng.randn(BATCH, 6), rng.randint(0, 4, BATCH).astype(np.int32)


def rank_model(comm, topology):
    """(target, dataset, own parts) of this rank."""
    parts = layers(topology)
    x, t = data()
    m = mnpar.MultiNodeChainList(comm)
    full = chainer.datasets.TupleDataset(x, t)
    empty = mnpar.datasets.create_empty_dataset(full)
    if topology == "loop":
        if comm.rank == 0:
            m.add_link(parts[0], None, 1)
            m.add_link(Identity(), 1, None)
            return L.Classifier(m), full, [parts[0]]
        if comm.rank == 1:
            m.add_link(parts[1], 0, 0)
            return m, empty, [parts[1]]
        return m, empty, []
    if comm.rank == 0:
        m.add_link(parts[0], None, 1)
        return m, x, [parts[0]]  # inputs only
    if comm.rank == 1:
        m.add_link(parts[1], 0, 2)
        return m, empty, [parts[1]]
    if comm.rank == 2:
        m.add_link(parts[2], 1, None)
        return L.Classifier(m), chainer.datasets.TupleDataset(t), [parts[2]]  # labels only
    return m, empty, []


def train_once(comm, topology, updater_of):
    target, dataset, own = rank_model(comm, topology)
    optimizer = chainer.optimizers.MomentumSGD(0.1).setup(target)
    it = chainer.iterators.SerialIterator(dataset, BATCH, shuffle=False)
    updater = updater_of(it, optimizer)
    updater.update()
    loss = getattr(target, "loss", None)
    updater.finalize()
    return [p.array.copy() for part in own for p in part.params()], target, loss


def reference(topology, comm):
    parts = layers(topology)
    model = L.Classifier(chainer.Sequential(*parts))
    chainer.optimizers.MomentumSGD(0.1).setup(model).update(model, *data())
    index = {"loop": {0: [0], 1: [1]}, "chain": {0: [0], 1: [1], 2: [2]}}[topology]
    mine = [parts[i] for i in index.get(comm.rank, [])]
    return [p.array for part in mine for p in part.params()], float(model.loss.array)


_PLAIN: dict = {}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", TRAINING_SCHEDULES)
@pytest.mark.parametrize("k", [1, 2, 3, 8])
@pytest.mark.parametrize("topology", ["loop",
                                      pytest.param("chain", marks=pytest.mark.mpi(min_size=3))])
def test_one_update_equals_the_unpipelined_and_one_process_updates(comm, topology, k,
                                                                      schedule):
    checkpoint = {1: "never", 2: "always", 3: "except_last", 8: "never"}[k]
    piped, _, _ = train_once(comm, topology, lambda it, opt: PipelineUpdater(
        it, opt, comm, k, schedule=schedule, checkpoint=checkpoint))
    if topology not in _PLAIN:  # the same on every rank: computed once per topology
        _PLAIN[topology] = train_once(comm, topology, lambda it, opt: chainer.training.
                                      StandardUpdater(it, opt,
                                                      loss_func=unpipelined(opt.target)))[0]
    plain = _PLAIN[topology]
    single, _ = reference(topology, comm)
    initial = [p.array for part in rank_model(comm, topology)[2] for p in part.params()]
    assert len(piped) == len(single)
    for a, b, c, before in zip(piped, plain, single, initial):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-12)
        assert not np.allclose(a, before)  # the update did something


def own_model(comm):
    """A whole model on every rank: each rank is a one-stage pipeline of its own."""
    m = mnpar.MultiNodeChainList(comm)
    parts = layers("loop")
    m.add_link(chainer.Sequential(*parts), None, None)
    return L.Classifier(m), chainer.datasets.TupleDataset(*data())


@pytest.mark.mpi
@pytest.mark.parametrize("schedule", TRAINING_SCHEDULES)
def test_one_stage_accumulates_micro_batches_into_the_full_batch_update(comm, schedule):
    target, dataset = own_model(comm)
    optimizer = chainer.optimizers.MomentumSGD(0.1).setup(target)
    it = chainer.iterators.SerialIterator(dataset, BATCH, shuffle=False)
    updater = PipelineUpdater(it, optimizer, comm, 4, schedule=schedule)
    updater.update()
    updater.finalize()
    whole = L.Classifier(chainer.Sequential(*layers("loop")))
    chainer.optimizers.MomentumSGD(0.1).setup(whole).update(whole, *data())
    for a, b in zip(target.params(), whole.params()):
        np.testing.assert_allclose(a.array, b.array, rtol=1e-10, atol=1e-12)


@pytest.mark.mpi(min_size=2)
def test_reported_loss_and_accuracy_are_the_mini_batch_means(comm):
    observation = {}
    target, dataset, _ = rank_model(comm, "loop")
    optimizer = chainer.optimizers.SGD(0.0).setup(target)
    it = chainer.iterators.SerialIterator(dataset, BATCH, shuffle=False)
    updater = PipelineUpdater(it, optimizer, comm, 3)
    reporter = chainer.Reporter()
    reporter.add_observer("main", target)
    with reporter.scope(observation):
        updater.update()
    updater.finalize()
    if comm.rank == 0:
        model = L.Classifier(chainer.Sequential(*layers("loop")))
        loss = model(*data())
        assert observation["main/loss"] == pytest.approx(float(loss.array), rel=1e-12)
        assert observation["main/accuracy"] == pytest.approx(float(model.accuracy.array))
    else:
        assert observation == {}


@pytest.mark.mpi
@pytest.mark.parametrize("k, error, match", [
    (0, ValueError, "n_microbatches=0 must be at least 1"),
    (-2, ValueError, "n_microbatches=-2 must be at least 1"),
    (2.0, TypeError, "n_microbatches must be an int"),
])
def test_bad_n_microbatches_is_a_clear_error_on_every_rank(comm, k, error, match):
    target, dataset = own_model(comm)
    optimizer = chainer.optimizers.SGD().setup(target)
    it = chainer.iterators.SerialIterator(dataset, BATCH)
    with pytest.raises(error, match=match):
        PipelineUpdater(it, optimizer, comm, k)


@pytest.mark.mpi(min_size=2)
def test_more_micro_batches_than_examples_is_a_clear_error_on_every_rank(comm):
    target, dataset, _ = rank_model(comm, "loop")
    optimizer = chainer.optimizers.SGD().setup(target)
    it = chainer.iterators.SerialIterator(dataset, 4)
    updater = PipelineUpdater(it, optimizer, comm, 5)
    with pytest.raises(ValueError, match="n_microbatches=5 is larger than the mini-batch of 4"):
        updater.update()
    updater.finalize()


@pytest.mark.mpi(min_size=2)
def test_unknown_schedule_and_checkpoint_are_clear_errors(comm):
    target, dataset, _ = rank_model(comm, "loop")
    optimizer = chainer.optimizers.SGD().setup(target)
    it = chainer.iterators.SerialIterator(dataset, BATCH)
    with pytest.raises(ValueError, match="schedule='zigzag' is not one of"):
        PipelineUpdater(it, optimizer, comm, 2, schedule="zigzag")
    with pytest.raises(ValueError, match="checkpoint='sometimes' is not one of"):
        PipelineUpdater(it, optimizer, comm, 2, checkpoint="sometimes")


@pytest.mark.mpi(min_size=2)
def test_trainer_with_pipelined_evaluation_and_a_trace(comm, tmp_path):
    target, dataset, _ = rank_model(comm, "loop")
    optimizer = chainer.optimizers.SGD(0.05).setup(target)
    train_it = chainer.iterators.SerialIterator(dataset, BATCH)
    test_it = chainer.iterators.SerialIterator(dataset, 4, repeat=False, shuffle=False)
    updater = PipelineUpdater(train_it, optimizer, comm, 3, schedule="gpipe", trace=True)
    out = tmp_path / f"rank{comm.rank}"
    trainer = chainer.training.Trainer(updater, (3, "iteration"), out=str(out))
    evaluator = PipelineEvaluator(test_it, target, comm, 3)
    trainer.extend(evaluator, trigger=(3, "iteration"))
    log = chainer.training.extensions.LogReport(trigger=(3, "iteration"))
    trainer.extend(log)
    trainer.run()
    events = updater.timeline
    own = {0: 2, 1: 1}.get(comm.rank, 0)
    actions = [e for e in events if not e.label.startswith("wait ")]
    waits = [e for e in events if e.label.startswith("wait ")]
    assert len(actions) == 2 * 3 * own  # a forward and a backward per component and micro-batch
    assert all(e.end >= e.start for e in events)
    # A receive that waited is its own event, inside the action that waited.
    for w in waits:
        assert any(a.start <= w.start and w.end <= a.end and w.label.startswith(f"wait {a.label}")
                   for a in actions), w
    path = tmp_path.parent / "trace.json"  # tmp_path differs per rank: rank 0's is used
    path = comm.bcast_obj(str(path))
    updater.save_timeline(path)
    if comm.rank == 0:
        assert "validation/main/loss" in log.log[-1]
        with open(path) as f:
            trace = json.load(f)["traceEvents"]
        assert sorted({e["pid"] for e in trace}) == [0, 1]
        cats = [e["cat"] for e in trace]
        # the loop's three components, forward and backward; the waits apart
        assert cats.count("forward") == cats.count("backward") == 3 * 3
        assert set(cats) <= {"forward", "backward", "wait"}
    piped = _evaluate(target, evaluator)
    plain_it = chainer.iterators.SerialIterator(dataset, 4, repeat=False, shuffle=False)
    plain = _evaluate(target, chainer.training.extensions.Evaluator(plain_it, target))
    if comm.rank == 0:
        assert piped["main/loss"] == pytest.approx(plain["main/loss"], rel=1e-10)
        assert piped["main/accuracy"] == pytest.approx(plain["main/accuracy"], rel=1e-10)


def _evaluate(target, evaluator):
    reporter = chainer.Reporter()
    reporter.add_observer("main", target)
    with reporter:
        return evaluator.evaluate()


class AddParam(chainer.Chain):
    """``x + p`` with ``p`` the shape of a micro-batch: its gradient is the output's, shared."""

    def __init__(self, shape):
        super().__init__()
        with self.init_scope():
            self.p = chainer.Parameter(np.random.RandomState(5).randn(*shape))

    def forward(self, x):
        return x + self.p


def local_chain(comm, parts):
    """``parts`` on this rank, each sending to the next through the rank's local queue."""
    m = mnpar.MultiNodeChainList(comm)
    for i, part in enumerate(parts):
        m.add_link(part, None if i == 0 else comm.rank,
                   None if i == len(parts) - 1 else comm.rank)
    return L.Classifier(m)


@pytest.mark.mpi
def test_summed_gradients_never_write_into_an_array_chainer_shares(comm):
    # Regression: summing the micro-batches' gradients in place must not write into
    # chainer's own array: here AddParam's gradient is the array its input's gradient
    # also is, which waits in the local queue for component 0's later backward.
    def parts():
        np.random.seed(11)
        return [float64(p) for p in (Dense(6, 6), AddParam((4, 6)), Dense(6, 4, relu=False))]

    rng = np.random.RandomState(2)
    x, t = rng.randn(12, 6), rng.randint(0, 4, 12).astype(np.int32)
    own = parts()
    target = local_chain(comm, own)
    optimizer = chainer.optimizers.SGD(0.1).setup(target)
    it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), 12,
                                          shuffle=False)
    updater = PipelineUpdater(it, optimizer, comm, 3, schedule="gpipe")
    updater.update()
    updater.finalize()
    whole_parts = parts()
    whole = L.Classifier(chainer.Sequential(*whole_parts))
    grads = [np.zeros_like(p.array) for part in whole_parts for p in part.params()]
    for i in range(3):  # the whole model has to see AddParam's 4-row micro-batches too
        whole.cleargrads()
        (whole(x[4 * i:4 * i + 4], t[4 * i:4 * i + 4]) / 3).backward()
        grads = [g + p.grad for g, p in
                 zip(grads, [p for part in whole_parts for p in part.params()])]
    for p, g in zip([p for part in whole_parts for p in part.params()], grads):
        p.array -= 0.1 * g
    for a, b in zip([p for part in own for p in part.params()],
                    [p for part in whole_parts for p in part.params()]):
        np.testing.assert_allclose(a.array, b.array, rtol=1e-10, atol=1e-12)


class BatchNormDropout(chainer.Chain):
    """Linear, BatchNormalization, dropout: running statistics and random masks."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(6, 8, initialW=chainer.initializers.Normal(0.5))
            self.bn = L.BatchNormalization(8)

    def forward(self, x):
        return F.dropout(F.relu(self.bn(self.l(x))), 0.5)


@pytest.mark.mpi
@pytest.mark.parametrize("schedule", TRAINING_SCHEDULES)
@pytest.mark.parametrize("checkpoint", ["except_last", "always"])
def test_recomputation_updates_running_statistics_once_and_redraws_the_same_masks(
        comm, schedule, checkpoint):
    def train(checkpoint):
        np.random.seed(4)
        parts = [BatchNormDropout(), Dense(8, 4, relu=False)]
        target = local_chain(comm, parts)
        optimizer = chainer.optimizers.SGD(0.1).setup(target)
        x, t = data()
        it = chainer.iterators.SerialIterator(
            chainer.datasets.TupleDataset(x.astype(np.float32), t), BATCH, shuffle=False)
        updater = PipelineUpdater(it, optimizer, comm, 3, schedule=schedule,
                                  checkpoint=checkpoint)
        np.random.seed(9)  # the dropout masks
        updater.update()
        updater.update()
        updater.finalize()
        state = {name: p.array.copy() for name, p in target.namedparams()}
        state.update((name, np.array(value)) for name, value in _persistents(parts[0].bn))
        return state

    recomputed, kept = train(checkpoint), train("never")
    assert sorted(recomputed) == sorted(kept)
    for name in kept:
        np.testing.assert_allclose(recomputed[name], kept[name], rtol=1e-6, atol=1e-7,
                                   err_msg=name)
    assert not np.allclose(kept["avg_mean"], 0)  # the statistics did move


def _persistents(link):
    return [(name, getattr(link, name)) for name in sorted(link._persistent)]


@pytest.mark.mpi(min_size=1)
def test_schedules_weigh_lazily_initialized_layers_once_they_have_a_size(comm):
    # A Linear(None, n) has no parameters to count before its first forward:
    # the first step runs on a guess, then every rank counts again and the
    # later schedules weigh the layer by its size, as the loss-free one is not.
    m = mnpar.MultiNodeChainList(comm)
    x, t = data()
    full = chainer.datasets.TupleDataset(x.astype(np.float32), t)
    if comm.rank == 0:
        m.add_link(L.Linear(None, 5), None, 1 % comm.size)
        m.add_link(Identity(), 1 % comm.size, None)
        target, dataset = L.Classifier(m), full
    else:
        if comm.rank == 1:
            m.add_link(L.Linear(5, 4), 0, 0)
        target, dataset = m, mnpar.datasets.create_empty_dataset(full)
    optimizer = chainer.optimizers.SGD(0.1).setup(target)
    updater = PipelineUpdater(chainer.iterators.SerialIterator(dataset, BATCH), optimizer,
                              comm, 2, schedule="1f1b")
    runner = updater.runner
    assert runner._recount and runner._costs[(0, 0)] == (1, 2, 0)  # no size yet: no W
    updater.update()
    assert not runner._recount
    assert runner._costs[(0, 0)][0] > runner._costs[(0, 1)][0] == 1  # Linear(6, 5) vs the loss
    updater.update()  # the new schedule runs
    updater.finalize()


STALL = """
import time
import chainer, chainer.links as L, numpy as np
import mnpar
from mnpar.pipeline import PipelineUpdater, build_stage
comm = mnpar.create_communicator("naive", timeout=3)


class Stall(chainer.Link):  # rank 0's first forward never ends in time
    def forward(self, x):
        if comm.rank == 0:
            time.sleep(30)
        return x


np.random.seed(0)
model = chainer.Sequential(L.Linear(8, 8), Stall(), L.Linear(8, 8), L.Linear(8, 4))
stage = build_stage(model, [2, 2], comm)
data = chainer.datasets.TupleDataset(np.zeros((16, 8), np.float32), np.zeros(16, np.int32))
target = L.Classifier(stage) if comm.rank == 0 else stage
if comm.rank != 0:
    data = mnpar.datasets.create_empty_dataset(data)
optimizer = chainer.optimizers.SGD().setup(target)
updater = PipelineUpdater(chainer.iterators.SerialIterator(data, 16), optimizer, comm, 4)
chainer.training.Trainer(updater, (1, "iteration")).run()
"""


@pytest.mark.slow
def test_a_wait_that_times_out_names_its_action_and_row_of_the_schedule(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "stall.py"
    script.write_text(STALL)
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, "-W", "ignore", str(script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert re.search(
        r"\[rank 1\] mnpar\._errors\.CommunicationTimeout: rank 1: recv with rank 0, tag 0 "
        r"did not complete after 3\.\d s \(timeout 3\.0 s\); waiting for a message from "
        r"rank 0; in the pipeline, action F0 \(1 of 8 on rank 1; its row of the schedule: "
        r"\[F0\] F1 B0 F2 B1 F3 B2 \.\.\.\)", proc.stderr), proc.stderr[-3000:]
