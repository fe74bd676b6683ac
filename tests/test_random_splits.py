"""Every split draws one process's random numbers under ``mnpar.random.scope``.

One model with every random function chainer has (dropout as a layer and in
a link, gaussian, rrelu, zoneout, simplified dropconnect with and without a
batchwise mask, gumbel-softmax) trains 3 Adam steps in one process under a
scope, on every rank; then split (pipeline stages under every schedule,
micro-batch count and recomputation; data-parallel replicas;
``MultiNodeChainList`` pieces; spatial tiles) under a scope of the same seed.
Outputs and gradients are equal bit for bit where the split adds up in the
same order (one micro-batch, pieces, tiles' per-element work), and
parameters after 3 steps to 1e-12 where micro-batches or replicas add
gradients in another order; a model that draws differently fails both.
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from helpers import Identity

import mnpar
from mnpar.pipeline import PipelineUpdater, build_stage
from mnpar.pipeline._schedule import TRAINING_SCHEDULES

pytestmark = pytest.mark.mpi(min_size=1)
BATCH, STEPS, SEED = 12, 3, 5


@pytest.fixture(scope="module")
def comm():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


class Noisy(chainer.Chain):
    """A link whose forward draws: zoneout, dropconnect (batchwise and not), gumbel-softmax."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.a = L.SimplifiedDropconnect(8, 8)
            self.b = L.SimplifiedDropconnect(8, 8)

    def forward(self, h):
        h = F.zoneout(h, self.a(h, 0.4, use_batchwise_mask=True), 0.3)
        h = self.b(h, 0.2, use_batchwise_mask=False)
        return F.gumbel_softmax(h, tau=2.0) + h


def whole():
    """The whole model, float64, the same weights on every call."""
    np.random.seed(3)
    model = chainer.Sequential(
        L.Linear(6, 8), F.dropout, L.Linear(8, 8), F.rrelu,
        lambda h: F.gaussian(h, F.tanh(h) - 3.0), Noisy(),
        lambda h: F.dropout(h, 0.3), L.Linear(8, 4))
    for p in model.params():
        p.array = p.array.astype(np.float64)
    return model


def data():
    rng = np.random.RandomState(0)
    return rng.randn(BATCH, 6), rng.randint(0, 4, BATCH).astype(np.int32)


def one_process():
    """(model, its parameters after each step) trained whole under the scope."""
    model = whole()
    optimizer = chainer.optimizers.Adam().setup(model)
    classifier = L.Classifier(model)
    x, t = data()
    with mnpar.random.scope(model, optimizer, seed=SEED):
        for _ in range(STEPS):
            optimizer.update(classifier, x, t)
    return model


def same(ours, ref, exact, what):
    theirs = dict(ref.namedparams())
    for name, p in ours.namedparams():
        if exact:
            assert np.array_equal(p.array, theirs[name].array), f"{name} {what}"
        else:
            np.testing.assert_allclose(p.array, theirs[name].array, rtol=1e-12, atol=1e-14,
                                       err_msg=f"{name} {what}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", TRAINING_SCHEDULES)
@pytest.mark.parametrize("k,checkpoint", [(1, "never"), (3, "except_last"), (4, "always")])
def test_a_pipeline_draws_one_processs_numbers(comm, schedule, k, checkpoint):
    ref = one_process()
    x, t = data()
    dataset = chainer.datasets.TupleDataset(x, t)
    model = whole()
    stages = comm.size if comm.size < 4 else 4
    sub = comm.split(int(comm.rank >= stages), comm.rank)
    if comm.rank >= stages:
        sub.finalize()
        return
    balance = {1: [8], 2: [4, 4], 3: [3, 3, 2], 4: [2, 2, 2, 2]}[stages]
    stage = build_stage(model, balance, sub)
    target = L.Classifier(stage) if sub.rank == 0 else stage
    if sub.rank != 0:
        dataset = mnpar.datasets.create_empty_dataset(dataset)
    optimizer = chainer.optimizers.Adam().setup(target)
    updater = PipelineUpdater(chainer.iterators.SerialIterator(dataset, BATCH, shuffle=False),
                              optimizer, sub, n_microbatches=k, schedule=schedule,
                              checkpoint=checkpoint)
    with mnpar.random.scope(model, optimizer, seed=SEED):
        for _ in range(STEPS):
            updater.update()
    updater.finalize()
    held = {id(p) for p in stage.params()}
    theirs = dict(ref.namedparams())
    for name, p in model.namedparams():
        if id(p) in held:
            if k == 1:
                assert np.array_equal(p.array, theirs[name].array), name
            else:
                np.testing.assert_allclose(p.array, theirs[name].array, rtol=1e-12,
                                           atol=1e-14, err_msg=name)
    sub.finalize()


def test_replicas_draw_their_slice_of_the_whole_batch(comm):
    ref = one_process()
    x, t = data()
    if BATCH % comm.size:
        pytest.skip(f"needs a rank count that divides {BATCH}")
    n = BATCH // comm.size
    mine = slice(comm.rank * n, (comm.rank + 1) * n)
    model = whole()
    optimizer = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)
    optimizer.setup(model)
    classifier = L.Classifier(model)
    with mnpar.random.scope(model, optimizer, seed=SEED, data=comm):
        for _ in range(STEPS):
            optimizer.update(classifier, x[mine], t[mine])
    same(model, ref, comm.size == 1, "after 3 steps")


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("k", [1, 3])
def test_replicas_of_a_pipeline_draw_their_slice_of_the_whole_batch(comm, k):
    # Mesh(data=2, pipeline=2): two pipelines of two stages, each a replica of half the batch.
    ref = one_process()
    if comm.rank >= 4:
        return
    four = comm.split(0, comm.rank)
    mesh = mnpar.Mesh(four, data=2, pipeline=2)
    dp, pp = mesh.comm("data"), mesh.comm("pipeline")
    x, t = data()
    half = slice(dp.rank * BATCH // 2, (dp.rank + 1) * BATCH // 2)
    dataset = chainer.datasets.TupleDataset(x[half], t[half])
    model = whole()
    stage = build_stage(model, [4, 4], pp)
    target = L.Classifier(stage) if pp.rank == 0 else stage
    if pp.rank != 0:
        dataset = mnpar.datasets.create_empty_dataset(dataset)
    optimizer = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), dp)
    optimizer.setup(target)
    updater = PipelineUpdater(chainer.iterators.SerialIterator(dataset, BATCH // 2,
                                                               shuffle=False),
                              optimizer, pp, n_microbatches=k)
    with mnpar.random.scope(model, optimizer, seed=SEED, data=dp):
        for _ in range(STEPS):
            updater.update()
    updater.finalize()
    held = {id(p) for p in stage.params()}
    theirs = dict(ref.namedparams())
    for name, p in model.namedparams():
        if id(p) in held:
            np.testing.assert_allclose(p.array, theirs[name].array, rtol=1e-12, atol=1e-14,
                                       err_msg=name)
    four.finalize()


@pytest.mark.mpi(min_size=2)
def test_replicas_with_batches_of_different_sizes_are_refused_on_every_rank(comm):
    model = whole()
    x, _ = data()
    rows = 4 + (comm.rank == 1)
    with mnpar.random.scope(model, seed=SEED, data=comm):
        with pytest.raises(ValueError, match=r"replicas' batches have \[4, 5.*same size"):
            model(x[:rows])


@pytest.mark.mpi(min_size=2)
def test_multi_node_chain_list_pieces_draw_as_the_model_they_make(comm):
    # The pieces are the whole model's layers 0-3 and 4-7, on ranks 0 and 1; each rank
    # names its piece by its path in the one-process model, Sequential(first, second).
    def pieces():
        layers = list(whole())
        return chainer.Sequential(*layers[:4]), chainer.Sequential(*layers[4:])

    x, t = data()
    first, second = pieces()
    ref = chainer.Sequential(first, second)
    optimizer = chainer.optimizers.Adam().setup(ref)
    with mnpar.random.scope(ref, optimizer, seed=SEED):
        for _ in range(STEPS):
            optimizer.update(L.Classifier(ref), x, t)
    if comm.rank > 1:
        return
    first, second = pieces()
    chain = mnpar.MultiNodeChainList(comm)
    if comm.rank == 0:
        chain.add_link(first, rank_in=None, rank_out=1)
        chain.add_link(Identity(), rank_in=1, rank_out=None)
        target, named = L.Classifier(chain), {"/0": first}
    else:
        chain.add_link(second, rank_in=0, rank_out=0)
        target, named = chain, {"/1": second}
    optimizer = chainer.optimizers.Adam().setup(target)
    with mnpar.random.scope(named, optimizer, seed=SEED):
        for _ in range(STEPS):
            target.cleargrads()
            loss = target(x, t) if comm.rank == 0 else target()
            loss.backward()
            optimizer.update()
    mine = first if comm.rank == 0 else second
    theirs = dict(ref.namedparams())
    for name, p in mine.namedparams():
        assert np.array_equal(p.array, theirs[f"/{comm.rank}{name}"].array), name


class Conv(chainer.Chain):
    """Convolutions with dropout, gaussian noise and rrelu on the tiles between them."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(2, 3, 3, pad=1)
            self.c2 = L.Convolution2D(3, 2, 3, pad=1)

    def forward(self, x):
        h = F.dropout(F.rrelu(self.c1(x)), 0.4)
        return self.c2(F.gaussian(h, F.tanh(h) - 3.0))


@pytest.mark.parametrize("shape", [(1, 1), pytest.param((1, 2), marks=pytest.mark.mpi(min_size=2)),
                                   pytest.param((2, 2), marks=pytest.mark.mpi(min_size=4))])
def test_tiles_draw_their_slice_of_the_whole_images(comm, grid):
    S = mnpar.spatial
    x = np.random.RandomState(1).randn(2, 2, 9, 7)

    def make():
        np.random.seed(0)
        model = Conv()
        for p in model.params():
            p.array = p.array.astype(np.float64)
        model.cleargrads()
        return model

    ref, ours = make(), S.convert(make(), grid)
    w = np.random.RandomState(2).randn(2, 2, 9, 7)
    with mnpar.random.scope(ref, seed=SEED):
        y = ref(x)
        F.sum(y * w).backward()
    with mnpar.random.scope(ours, seed=SEED):
        yt = ours(grid.tile(x))
        S.sum_over_grid(F.sum(yt * grid.tile(w)), grid).backward()
    assert np.array_equal(yt.array, grid.tile(y.array))
    for (name, p), (_, q) in zip(sorted(ours.namedparams()), sorted(ref.namedparams())):
        np.testing.assert_allclose(p.grad, q.grad, rtol=1e-12, atol=1e-13, err_msg=name)
