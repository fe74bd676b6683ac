"""PipelineUpdater with data parallelism: two pipelines, each a data-parallel replica.

::

    world rank     0      1      2      3
    pipeline (mp)  0      0      1      1
    stage (dp)     0      1      0      1     gradients averaged over the same stage
    components     A, C   B      A, C   B     rank 0 of a pipeline: A -> (B) -> C, loss

Each pipeline reads its own half of the data (``ROWS`` rows a step) and cuts
it in micro-batches; the optimizer averages each stage's gradients with the
other pipeline's. One update, and three, equal single-process training of
the whole model on both halves at once (float64, the mean loss over all
rows). Ranks past the first four sit out.
"""
import chainer
import chainer.links as L
import numpy as np
import pytest
from helpers import Dense, float64

import mnpar
from mnpar.pipeline import PipelineUpdater
from mnpar.pipeline._schedule import TRAINING_SCHEDULES

ROWS = 6  # per pipeline and step: 4 micro-batches are uneven (2, 2, 1, 1)
STEPS = 3  # the most updates a test runs; each pipeline holds STEPS * ROWS rows
PIPELINES = 2


@pytest.fixture(scope="module")
def comms():
    """(mp, dp) of this rank, or None on a rank that sits out."""
    world = mnpar.create_communicator("naive", timeout=20)
    active = world.rank < 2 * PIPELINES
    mp = world.split(world.rank // 2 if active else PIPELINES + world.rank, world.rank % 2)
    dp = world.split(world.rank % 2 if active else 2 + world.rank, world.rank // 2)
    yield (mp, dp) if active else None
    for c in (dp, mp, world):
        c.finalize()


def layers():
    """A, B, C of the whole model, seeded: the same float64 weights on every call."""
    np.random.seed(7)
    return [float64(p) for p in (Dense(6, 8), Dense(8, 7), Dense(7, 4, relu=False))]


def data():
    """Every row of the test: pipeline g reads rows [g * STEPS * ROWS, (g + 1) * STEPS * ROWS)."""
    rng = np.random.RandomState(3)
    n = PIPELINES * STEPS * ROWS
    return rng.randn(n, 6), rng.randint(0, 4, n).astype(np.int32)


def stage_of(mp, dp):
    """(target, dataset, own parts) of this rank: its stage of pipeline ``dp.rank``."""
    parts = layers()
    x, t = data()
    lo, hi = dp.rank * STEPS * ROWS, (dp.rank + 1) * STEPS * ROWS
    half = chainer.datasets.TupleDataset(x[lo:hi], t[lo:hi])
    m = mnpar.MultiNodeChainList(mp)
    if mp.rank == 0:
        m.add_link(parts[0], None, 1)
        m.add_link(parts[2], 1, None)
        return L.Classifier(m), half, [parts[0], parts[2]]
    m.add_link(parts[1], 0, 0)
    return m, mnpar.datasets.create_empty_dataset(half), [parts[1]]


def single_process(steps):
    """The parts after ``steps`` updates of the whole model on both pipelines' rows."""
    parts = layers()
    model = L.Classifier(chainer.Sequential(*parts))
    optimizer = chainer.optimizers.MomentumSGD(0.1).setup(model)
    x, t = data()
    for step in range(steps):
        rows = np.concatenate([np.arange(ROWS) + g * STEPS * ROWS + step * ROWS
                               for g in range(PIPELINES)])
        optimizer.update(model, x[rows], t[rows])
    return parts


def _arrays(parts):
    return [p.array.copy() for part in parts for p in part.params()]


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("schedule", TRAINING_SCHEDULES)
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("steps", [1, STEPS])
def test_pipelines_as_data_parallel_replicas_equal_single_process_training(
        comms, steps, k, schedule):
    if comms is None:
        return  # this rank sits out
    mp, dp = comms
    target, dataset, own = stage_of(mp, dp)
    initial = _arrays(own)
    optimizer = mnpar.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(0.1), dp)
    optimizer.setup(target)
    it = chainer.iterators.SerialIterator(dataset, ROWS, shuffle=False)
    updater = PipelineUpdater(it, optimizer, mp, k, schedule=schedule)
    for _ in range(steps):
        updater.update()
    updater.finalize()
    whole = single_process(steps)
    mine = _arrays([whole[0], whole[2]] if mp.rank == 0 else [whole[1]])
    got = _arrays(own)
    assert len(got) == len(mine) == len(initial) == (4 if mp.rank == 0 else 2)
    for a, b, before in zip(got, mine, initial):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        assert not np.allclose(a, before)  # the update did something
