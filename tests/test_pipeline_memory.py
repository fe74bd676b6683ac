"""What a pipelined step keeps alive: within what its plan predicts.

``Plan.peak_activations`` predicts, per rank, the most micro-batch segments
alive at once; the executor measures the segments it holds and their bytes
(the arrays their graphs retain) after every action. At K = 16 both stay
within the prediction, and the send buffers still held stay within the
messages the schedule lets a rank run ahead.
"""
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import mnpar
from mnpar.pipeline import PipelineUpdater, PipelineWarning, build_stage
from mnpar.pipeline._schedule import TRAINING_SCHEDULES

K, BATCH, UNITS = 16, 64, 32


@pytest.fixture(scope="module")
def comm():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


def _mlp(n):
    layers = []
    for _ in range(2 * n):
        layers += [L.Linear(UNITS, UNITS), F.relu]
    return layers


def _updater(comm, schedule, layers=_mlp, measure=False):
    np.random.seed(0)
    n = comm.size
    model = chainer.Sequential(*layers(n))
    stage = build_stage(model, [len(model) // n] * n, comm, loop=False)
    rng = np.random.RandomState(1)
    x = rng.randn(BATCH, UNITS).astype(np.float32)
    t = rng.randint(0, UNITS, BATCH).astype(np.int32)
    last = n - 1
    target = L.Classifier(stage) if comm.rank == last else stage
    dataset = {0: x, last: chainer.datasets.TupleDataset(t)}.get(
        comm.rank, mnpar.datasets.create_empty_dataset(x))
    if comm.rank == 0 == last:
        dataset = chainer.datasets.TupleDataset(x, t)
    it = chainer.iterators.SerialIterator(dataset, BATCH, shuffle=False)
    opt = chainer.optimizers.SGD(0.1).setup(target)
    return PipelineUpdater(it, opt, comm, K, schedule=schedule, measure=measure)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", TRAINING_SCHEDULES)
def test_live_activations_stay_within_the_predicted_peak_at_k16(comm, schedule):
    updater = _updater(comm, schedule, measure=True)
    updater.update()
    measured = updater.statistics
    predicted = updater.runner.plan(K).peak_activations[comm.rank]
    sent = updater.runner.transfer.peak_pending_bytes
    updater.finalize()
    assert 0 < measured.peak_segments <= predicted
    assert measured.peak_bytes <= predicted * measured.segment_bytes
    message = (BATCH // K) * UNITS * 4  # one micro-batch's activations or gradients
    # A rank runs at most ``predicted`` micro-batches ahead of its neighbours, and
    # each sends one message forward and one back: buffers do not grow with K.
    assert sent <= 2 * (predicted + 1) * message + 4096
    if schedule == "gpipe":
        assert predicted == K
    else:
        assert predicted <= comm.size * (2 if schedule == "zb2" else 1)


class ScaledLinear(chainer.Link):
    """``x W^T`` with W reshaped first: its weight reaches the graph through Reshape."""

    def __init__(self, n):
        super().__init__()
        with self.init_scope():
            self.w = chainer.Parameter(np.random.RandomState(2).randn(n * n).astype(np.float32))
        self.n = n

    def forward(self, x):
        return F.matmul(x, F.reshape(self.w, (self.n, self.n)), transb=True)


@pytest.mark.mpi(min_size=2)
def test_a_backward_that_cannot_split_runs_whole_and_says_so_once(comm):
    def layers(n):
        return [L.Linear(UNITS, UNITS)] + [ScaledLinear(UNITS) for _ in range(2 * n - 1)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        split = _updater(comm, "zb1", layers)
        split.update()
        split.update()
    plain = _updater(comm, "1f1b", layers)
    plain.update()
    plain.update()
    ours = [p.array for p in split.get_optimizer("main").target.params()]
    theirs = [p.array for p in plain.get_optimizer("main").target.params()]
    split.finalize()
    plain.finalize()
    mine = [w for w in caught if issubclass(w.category, PipelineWarning)]
    if comm.rank == 0:
        assert not mine  # the first stage has no W to lose
    else:
        assert len(mine) == 1 and "cannot be split" in str(mine[0].message)
        assert "Reshape" in str(mine[0].message)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("budget", [None, 1])
def test_v_placement_keeps_within_its_predicted_peak_and_its_budget(comm, budget):
    # placement='v': rank i holds parts i and 2n - 1 - i; data and loss on rank 0. With a
    # budget of 2n + 1 segments (ZB-V's 2n, one more for a W left for later), or none.
    np.random.seed(0)
    n = comm.size
    memory = None if budget is None else 2 * n + budget
    model = chainer.Sequential(*_mlp(n))  # 4n layers: 2n parts of two
    stage = build_stage(model, [2] * (2 * n), comm, chunks=2, placement="v")
    rng = np.random.RandomState(1)
    x = rng.randn(BATCH, UNITS).astype(np.float32)
    t = rng.randint(0, UNITS, BATCH).astype(np.int32)
    dataset = (chainer.datasets.TupleDataset(x, t) if comm.rank == 0
               else mnpar.datasets.create_empty_dataset(x))
    target = L.Classifier(stage) if comm.rank == 0 else stage
    it = chainer.iterators.SerialIterator(dataset, BATCH, shuffle=False)
    opt = chainer.optimizers.SGD(0.1).setup(target)
    updater = PipelineUpdater(it, opt, comm, K, schedule="zb1", measure=True, memory=memory)
    updater.update()
    plan = updater.runner.plan(K)
    updater.finalize()
    predicted = plan.peak_activations[comm.rank]
    assert 0 < updater.statistics.peak_segments <= predicted
    if memory is not None:
        assert plan.memory == {r: memory for r in range(n)} and predicted <= memory
    else:
        assert predicted > 2 * n + 1  # without a budget zb1 keeps more (its bound is per part)


@pytest.mark.mpi(min_size=2)
def test_a_budget_that_differs_on_one_rank_is_refused_on_every_rank(comm):
    # Each rank plans alone: budgets that differ would give the ranks different lists.
    stage = build_stage(chainer.Sequential(*_mlp(comm.size)), [4] * comm.size, comm,
                        loop=True)
    target = L.Classifier(stage) if comm.rank == 0 else stage
    it = chainer.iterators.SerialIterator(np.zeros((BATCH, UNITS), np.float32), BATCH)
    opt = chainer.optimizers.SGD(0.1).setup(target)
    with pytest.raises(ValueError, match=r"PipelineUpdater: the ranks disagree: memory 5 on "
                                         r"rank 0; 6 on ranks? 1"):
        PipelineUpdater(it, opt, comm, K, schedule="zb1", memory=5 if comm.rank == 0 else 6)
