"""PipelineUpdater on graphs other than a chain: a branch that merges, and a ring.

The wirings are the ones ``test_pipeline_schedule.py`` only simulates::

    branch   rank0 c0 ─┬─> rank1 ─┬─> rank0 c1      (rank 1's output first, rank 2's second)
                       └─> rank2 ─┘

    ring     rank0 c0 ──> rank1 ──> rank2 ──> rank3
             rank0 c1 <─────────────────────────┘

Rank 0's ``c1`` gives the model's output and takes the loss. After one
update every rank's parameters equal those of the same MultiNodeChainList
trained without pipelining and those of the whole model in one process
(float64, same seeded weights), with and without activation recomputation.
Ranks past the graph hold an empty MultiNodeChainList and take part in
every collective.
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from helpers import Dense, float64, unpipelined

import mnpar
from mnpar.pipeline import PipelineUpdater
from mnpar.pipeline._schedule import TRAINING_SCHEDULES

BATCH = 10  # not divisible by 3 or 8
BRANCH = {0: [(None, (1, 2)), ((1, 2), None)], 1: [((0,), (0,))], 2: [((0,), (0,))]}
RING4 = {0: [(None, (1,)), ((3,), None)], 1: [((0,), (2,))], 2: [((1,), (3,))],
         3: [((2,), (0,))]}
WIRINGS = {"branch": BRANCH, "ring": RING4}


@pytest.fixture(scope="module")
def comm():
    c = mnpar.create_communicator("naive", timeout=20)
    yield c
    c.finalize()


class Merge(chainer.Chain):
    """``l(concat(a, b))``: swapping its two arguments changes the result."""

    def __init__(self, n_a, n_b, n_out):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(n_a + n_b, n_out, initialW=chainer.initializers.Normal(0.5))

    def forward(self, a, b):
        return self.l(F.concat((a, b), axis=1))


def parts_of(graph):
    """The whole model's components by (rank, index), seeded: the same weights on every call."""
    np.random.seed(7)
    if graph == "branch":
        parts = {(0, 0): Dense(6, 8), (1, 0): Dense(8, 5), (2, 0): Dense(8, 3),
                 (0, 1): Merge(5, 3, 4)}
    else:
        parts = {(0, 0): Dense(6, 8), (1, 0): Dense(8, 7), (2, 0): Dense(7, 8),
                 (3, 0): Dense(8, 6), (0, 1): Dense(6, 4, relu=False)}
    return {node: float64(p) for node, p in parts.items()}


class Whole(chainer.ChainList):
    """The whole computation in one process, written out by hand."""

    def __init__(self, graph, parts):
        super().__init__(*parts.values())
        self.graph, self.parts = graph, parts

    def forward(self, x):
        p = self.parts
        h = p[(0, 0)](x)
        if self.graph == "branch":
            return p[(0, 1)](p[(1, 0)](h), p[(2, 0)](h))
        return p[(0, 1)](p[(3, 0)](p[(2, 0)](p[(1, 0)](h))))


def data():
    rng = np.random.RandomState(3)
    return rng.randn(BATCH, 6), rng.randint(0, 4, BATCH).astype(np.int32)


def own_params(parts, rank):
    """This rank's parameter arrays, in component order."""
    return [p.array for node in sorted(parts) if node[0] == rank
            for p in parts[node].params()]


def rank_model(comm, graph):
    """(target, dataset, every part) of this rank, wired as ``WIRINGS[graph]``."""
    parts = parts_of(graph)
    m = mnpar.MultiNodeChainList(comm)
    for i, (rank_in, rank_out) in enumerate(WIRINGS[graph].get(comm.rank, [])):
        m.add_link(parts[(comm.rank, i)], rank_in, rank_out)
    full = chainer.datasets.TupleDataset(*data())
    if comm.rank == 0:
        return L.Classifier(m), full, parts
    return m, mnpar.datasets.create_empty_dataset(full), parts


def train_once(comm, graph, updater_of):
    target, dataset, parts = rank_model(comm, graph)
    optimizer = chainer.optimizers.MomentumSGD(0.1).setup(target)
    it = chainer.iterators.SerialIterator(dataset, BATCH, shuffle=False)
    updater = updater_of(it, optimizer)
    updater.update()
    updater.finalize()
    return [a.copy() for a in own_params(parts, comm.rank)]


def single_process(graph, rank):
    parts = parts_of(graph)
    model = L.Classifier(Whole(graph, parts))
    chainer.optimizers.MomentumSGD(0.1).setup(model).update(model, *data())
    return own_params(parts, rank)


_PLAIN: dict = {}


@pytest.mark.parametrize("schedule", TRAINING_SCHEDULES)
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("graph", [pytest.param("branch", marks=pytest.mark.mpi(min_size=3)),
                                   pytest.param("ring", marks=pytest.mark.mpi(min_size=4))])
def test_one_update_equals_the_unpipelined_and_one_process_updates(comm, graph, k, schedule):
    checkpoint = {1: "never", 3: "except_last", 8: "always"}[k]
    piped = train_once(comm, graph, lambda it, opt: PipelineUpdater(
        it, opt, comm, k, schedule=schedule, checkpoint=checkpoint))
    if graph not in _PLAIN:  # the same for every schedule and k: computed once per graph
        _PLAIN[graph] = train_once(comm, graph, lambda it, opt: chainer.training.
                                   StandardUpdater(it, opt, loss_func=unpipelined(opt.target)))
    plain = _PLAIN[graph]
    single = single_process(graph, comm.rank)
    initial = own_params(parts_of(graph), comm.rank)
    assert len(piped) == len(plain) == len(single) == len(initial)
    assert len(piped) == 2 * len(WIRINGS[graph].get(comm.rank, []))  # W and b of each
    for a, b, c, before in zip(piped, plain, single, initial):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-12)
        assert not np.allclose(a, before)  # the update did something
