"""build_stage: a Sequential cut by a balance trains as the whole model does."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from helpers import float64

import mnpar
from mnpar.pipeline import PipelineUpdater, build_stage
from mnpar.pipeline._schedule import TRAINING_SCHEDULES


@pytest.fixture(scope="module")
def comm():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


def _model(n_linear):
    np.random.seed(5)
    layers = []
    for _ in range(n_linear):
        layers += [L.Linear(6, 6, initialW=chainer.initializers.Normal(0.5)), F.relu]
    return float64(chainer.Sequential(*layers[:-1]))


def _data():
    rng = np.random.RandomState(1)
    return rng.randn(7, 6), rng.randint(0, 6, 7).astype(np.int32)


@pytest.mark.mpi
@pytest.mark.parametrize("loop", [True, False])
def test_stages_train_as_the_whole_model(comm, loop):
    n = comm.size
    model = _model(n + 1)  # 2n + 1 layers and functions
    balance = [2] * (n - 1) + [3]
    stage = build_stage(model, balance, comm, loop=loop)
    x, t = _data()
    loss_rank = 0 if loop else n - 1
    target = L.Classifier(stage) if comm.rank == loss_rank else stage
    if comm.rank == loss_rank == 0:
        dataset = chainer.datasets.TupleDataset(x, t)
    elif comm.rank == 0:
        dataset = x
    elif comm.rank == loss_rank:
        dataset = chainer.datasets.TupleDataset(t)
    else:
        dataset = mnpar.datasets.create_empty_dataset(x)
    optimizer = chainer.optimizers.SGD(0.5).setup(target)
    it = chainer.iterators.SerialIterator(dataset, 7, shuffle=False)
    updater = PipelineUpdater(it, optimizer, comm, 3)
    updater.update()
    updater.finalize()
    whole = _model(n + 1)
    classifier = L.Classifier(whole)
    chainer.optimizers.SGD(0.5).setup(classifier).update(classifier, x, t)
    start = sum(balance[:comm.rank])
    mine = [layer for layer in list(whole)[start:start + balance[comm.rank]]
            if isinstance(layer, chainer.Link)]
    ours = [p.array for layer in stage[0] if isinstance(layer, chainer.Link)
            for p in layer.params()]
    theirs = [p.array for layer in mine for p in layer.params()]
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.mpi
@pytest.mark.parametrize("balance, match", [
    ("short", "parts for"),
    ("zero", "at least one layer"),
    ("sum", "sums to"),
])
def test_a_balance_that_does_not_fit_is_a_clear_error(comm, balance, match):
    n = comm.size
    bad = {"short": [1] * (n + 1), "zero": [2 * n + 1] + [0] * (n - 1) if n > 1 else [0],
           "sum": [1] * n}[balance]
    with pytest.raises(ValueError, match=match):
        build_stage(_model(n + 1), bad, comm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", TRAINING_SCHEDULES)
@pytest.mark.parametrize("loop", [True, False])
def test_interleaved_chunks_train_as_the_whole_model(comm, loop, schedule):
    # chunks=2: rank i holds parts i and i + n; a micro-batch passes each rank twice.
    n = comm.size
    model = _model(2 * n)  # 4n - 1 layers and functions: 2n parts
    balance = [2] * (2 * n - 1) + [1]
    stage = build_stage(model, balance, comm, loop=loop, chunks=2)
    assert len(stage) == 2 + (loop and comm.rank == 0)
    x, t = _data()
    loss_rank = 0 if loop else n - 1
    target = L.Classifier(stage) if comm.rank == loss_rank else stage
    dataset = {(True, True): chainer.datasets.TupleDataset(x, t), (True, False): x,
               (False, True): chainer.datasets.TupleDataset(t)}.get(
        (comm.rank == 0, comm.rank == loss_rank), mnpar.datasets.create_empty_dataset(x))
    optimizer = chainer.optimizers.SGD(0.5).setup(target)
    it = chainer.iterators.SerialIterator(dataset, 7, shuffle=False)
    updater = PipelineUpdater(it, optimizer, comm, 3, schedule=schedule)
    updater.update()
    updater.finalize()
    whole = _model(2 * n)
    before = [p.array.copy() for p in whole.params()]
    classifier = L.Classifier(whole)
    chainer.optimizers.SGD(0.5).setup(classifier).update(classifier, x, t)
    starts = [sum(balance[:j]) for j in range(2 * n + 1)]
    layers = list(whole)
    mine = [layer for j in (comm.rank, comm.rank + n) for layer in layers[starts[j]:starts[j + 1]]
            if isinstance(layer, chainer.Link)]
    ours = [p.array for part in (stage[0], stage[1]) for layer in part
            if isinstance(layer, chainer.Link) for p in layer.params()]
    theirs = [p.array for layer in mine for p in layer.params()]
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert not all(np.array_equal(a, b.array) for a, b in zip(before, whole.params()))


@pytest.mark.mpi
def test_chunks_must_be_a_positive_int(comm):
    with pytest.raises(ValueError, match="chunks=0 must be an int of at least 1"):
        build_stage(_model(2), [1] * comm.size, comm, chunks=0)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", TRAINING_SCHEDULES)
@pytest.mark.parametrize("loop", [True, False])
def test_v_placement_trains_as_the_whole_model(comm, loop, schedule):
    # placement='v': rank i holds parts i and 2n - 1 - i; the last part, and with it the
    # output and the loss, is rank 0's whatever loop says. Float64, one update, any schedule.
    n = comm.size
    model = _model(2 * n)  # 4n - 1 layers and functions: 2n parts
    balance = [2] * (2 * n - 1) + [1]
    stage = build_stage(model, balance, comm, loop=loop, chunks=2, placement="v")
    down_and_up = [j if j < n else 2 * n - 1 - j for j in range(2 * n)]  # part -> rank
    assert [tuple(w) for w in stage.wiring] == [
        (None if j == 0 else (down_and_up[j - 1],),
         None if j == 2 * n - 1 else (down_and_up[j + 1],))
        for j in (comm.rank, 2 * n - 1 - comm.rank)]
    x, t = _data()
    target = L.Classifier(stage) if comm.rank == 0 else stage
    dataset = (chainer.datasets.TupleDataset(x, t) if comm.rank == 0
               else mnpar.datasets.create_empty_dataset(x))
    optimizer = chainer.optimizers.SGD(0.5).setup(target)
    it = chainer.iterators.SerialIterator(dataset, 7, shuffle=False)
    updater = PipelineUpdater(it, optimizer, comm, 3, schedule=schedule)
    updater.update()
    updater.finalize()
    whole = _model(2 * n)
    classifier = L.Classifier(whole)
    chainer.optimizers.SGD(0.5).setup(classifier).update(classifier, x, t)
    starts = [sum(balance[:j]) for j in range(2 * n + 1)]
    layers = list(whole)
    mine = [layer for j in (comm.rank, 2 * n - 1 - comm.rank)
            for layer in layers[starts[j]:starts[j + 1]] if isinstance(layer, chainer.Link)]
    ours = [p.array for part in (stage[0], stage[1]) for layer in part
            if isinstance(layer, chainer.Link) for p in layer.params()]
    theirs = [p.array for layer in mine for p in layer.params()]
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.mpi
@pytest.mark.parametrize("placement, chunks, match", [
    ("w", 2, r"placement='w' is not one of \('interleaved', 'v'\)"),
    ("v", 3, "placement='v' needs chunks=2"),
])
def test_a_placement_that_does_not_exist_or_fit_is_a_clear_error(comm, placement, chunks, match):
    with pytest.raises(ValueError, match=match):
        build_stage(_model(2 * chunks * comm.size), [1] * (chunks * comm.size), comm,
                    chunks=chunks, placement=placement)


@pytest.mark.mpi(min_size=2)
def test_a_placement_that_differs_on_one_rank_is_refused_on_every_rank(comm):
    n = comm.size
    with pytest.raises(ValueError, match=r"build_stage: the ranks disagree: placement 'v' on "
                                         r"rank 0; 'interleaved' on ranks? 1.*same placement"):
        build_stage(_model(2 * n), [2] * (2 * n - 1) + [1], comm, chunks=2,
                    placement="v" if comm.rank == 0 else "interleaved")
