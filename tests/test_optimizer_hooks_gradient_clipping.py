"""GradientClipping across pieces: the whole model's norm, as one process clips it.

Transparency: after clipped updates every rank's parameters equal those of
the whole model trained in one process with chainer's own GradientClipping
(float64): a MultiNodeChainList, pipeline stages under every schedule,
data-parallel copies; the norm counts each replicated parameter once.
"""
import warnings

import chainer
import chainer.links as L
import numpy as np
import pytest
from helpers import Dense, Identity, float64, unpipelined

import mnpar
from mnpar.optimizer_hooks import ClippingWarning, GradientClipping
from mnpar.pipeline import PipelineUpdater, build_stage
from mnpar.pipeline._schedule import TRAINING_SCHEDULES

pytestmark = pytest.mark.mpi(min_size=1)
BATCH = 6  # divisible by 2 and 3 ranks
THRESHOLD = 0.05  # below every norm here: each update clips
TOL = dict(rtol=1e-12, atol=1e-14)


@pytest.fixture(scope="module")
def comm():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


def data():
    rng = np.random.RandomState(3)
    return rng.randn(BATCH, 6), rng.randint(0, 4, BATCH).astype(np.int32)


def parts(n):
    """n seeded float64 layers, 6 -> 8 -> ... -> 4: the whole model's pieces."""
    np.random.seed(7)
    sizes = [6] + [8] * (n - 1) + [4]
    return [float64(Dense(a, b, relu=i < n - 1)) for i, (a, b) in
            enumerate(zip(sizes, sizes[1:]))]


class Recorder(chainer.optimizer_hooks.GradientClipping):
    """chainer's hook on the whole model, keeping the norm it clipped by."""

    def __init__(self, threshold):
        super().__init__(threshold)
        self.norms = []

    def __call__(self, opt):
        grads = [p.grad.ravel() for p in opt.target.params(False)]
        self.norms.append(float(np.sqrt(sum(g.dot(g) for g in grads))))
        super().__call__(opt)


def one_process(layers, updates=2, examples=BATCH):
    """The whole model trained in one process with chainer's hook (on the first
    ``examples`` of the batch); its norms."""
    model = L.Classifier(chainer.Sequential(*layers))
    optimizer = chainer.optimizers.SGD(0.5).setup(model)
    hook = Recorder(THRESHOLD)
    optimizer.add_hook(hook)
    x, t = data()
    for _ in range(updates):
        optimizer.update(model, x[:examples], t[:examples])
    return hook.norms


def assert_same(ours, theirs):
    ours, theirs = list(ours), list(theirs)
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.array, b.array, **TOL)


def chain_list(comm, layers):
    """Rank i holds layer i; the output comes back to rank 0, which has the loss."""
    n, r = comm.size, comm.rank
    m = mnpar.MultiNodeChainList(comm)
    if n == 1:
        m.add_link(chainer.Sequential(*layers), None, None)
        return L.Classifier(m)
    m.add_link(layers[r], None if r == 0 else r - 1, (r + 1) % n)
    if r == 0:
        m.add_link(Identity(), n - 1, None)
        return L.Classifier(m)
    return m


def train(comm, target, updater_of, hook, updates=2):
    x, t = data()
    full = chainer.datasets.TupleDataset(x, t)
    dataset = full if isinstance(target, L.Classifier) else \
        mnpar.datasets.create_empty_dataset(full)
    optimizer = chainer.optimizers.SGD(0.5).setup(target)
    optimizer.add_hook(hook)
    updater = updater_of(chainer.iterators.SerialIterator(dataset, BATCH, shuffle=False),
                         optimizer)
    norms = []
    for _ in range(updates):
        updater.update()
        norms.append(getattr(hook, "norm", None))
    updater.finalize()
    return norms


@pytest.mark.mpi(min_size=2)
def test_a_multi_node_chain_list_clips_as_one_process(comm):
    layers = parts(comm.size)
    hook = GradientClipping(comm, THRESHOLD)
    norms = train(comm, chain_list(comm, layers), lambda it, opt: chainer.training.
                  StandardUpdater(it, opt, loss_func=unpipelined(opt.target)), hook)
    whole = parts(comm.size)
    expected = one_process(whole)
    np.testing.assert_allclose(norms, expected, **TOL)
    assert min(expected) > THRESHOLD  # both updates clipped
    assert_same(layers[comm.rank].params(), whole[comm.rank].params())


@pytest.mark.mpi(min_size=2)
def test_chainer_s_own_hook_on_each_piece_does_not(comm):
    # The control: per-rank clipping gives another update (this is what the hook fixes).
    layers = parts(comm.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ClippingWarning)
        train(comm, chain_list(comm, layers), lambda it, opt: chainer.training.
              StandardUpdater(it, opt, loss_func=unpipelined(opt.target)),
              chainer.optimizer_hooks.GradientClipping(THRESHOLD), 1)
    whole = parts(comm.size)
    one_process(whole, 1)
    differs = any(not np.allclose(a.array, b.array, **TOL)
                  for a, b in zip(layers[comm.rank].params(), whole[comm.rank].params()))
    assert comm.allreduce_obj(int(differs)) > 0


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", TRAINING_SCHEDULES)
def test_pipeline_stages_clip_as_one_process(comm, schedule):
    n = comm.size
    model = chainer.Sequential(*parts(n + 1))
    stage = build_stage(model, [2] + [1] * (n - 1), comm)
    target = L.Classifier(stage) if comm.rank == 0 else stage
    hook = GradientClipping(comm, THRESHOLD)
    norms = train(comm, target, lambda it, opt: PipelineUpdater(it, opt, comm, 3,
                                                                schedule=schedule), hook)
    whole = parts(n + 1)
    expected = one_process(whole)
    np.testing.assert_allclose(norms, expected, **TOL)
    mine = whole[:2] if comm.rank == 0 else [whole[comm.rank + 1]]
    assert_same(stage[0].params(), [p for layer in mine for p in layer.params()])


@pytest.mark.mpi
def test_data_parallel_copies_count_once(comm):
    # Every rank holds the whole model and a shard of the batch; after the mean
    # every copy's gradients are equal: declared replicated over the communicator.
    x, t = data()
    shard = BATCH // comm.size
    mine = slice(comm.rank * shard, (comm.rank + 1) * shard)
    model = L.Classifier(chainer.Sequential(*parts(2)))
    optimizer = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(0.5), comm)
    optimizer.setup(model)
    hook = GradientClipping(comm, THRESHOLD, replicated=[(comm, model)])
    optimizer.add_hook(hook)
    norms = []
    for _ in range(2):
        optimizer.update(model, x[mine], t[mine])
        norms.append(hook.norm)
    whole = parts(2)  # the shards cover shard * size examples (4 ranks: 4 of 6)
    np.testing.assert_allclose(norms, one_process(whole, examples=shard * comm.size), **TOL)
    assert_same(model.params(), [p for layer in whole for p in layer.params()])


class Declares(chainer.Link):
    """A link whose parameter is equal over ``comm``, as it says (``mnpar_replicas``)."""

    def __init__(self, comm, value):
        super().__init__()
        self.comm = comm
        with self.init_scope():
            self.w = chainer.Parameter(np.zeros(3))
        self.w.grad = np.full(3, value)

    def mnpar_replicas(self):
        return [(self.comm, [self.w])]


@pytest.mark.mpi
def test_replicas_over_groups_of_ranks_count_once(comm):
    # Groups {0, 1}, {2}, ...: `shared` is equal within a group (declared to the
    # hook), `declared.w` within the group too (declared by its link); `own` is a piece.
    group = comm.split(comm.rank // 2, comm.rank)
    try:
        color = comm.rank // 2
        model = chainer.Chain()
        with model.init_scope():
            model.own = chainer.Parameter(np.zeros(2))
            model.shared = chainer.Parameter(np.zeros(4))
            model.declared = Declares(group, 5.0 + color)
        model.own.grad = np.full(2, comm.rank + 1.0)
        model.shared.grad = np.full(4, 10.0 + color)
        optimizer = chainer.optimizers.SGD(0.0).setup(model)
        hook = GradientClipping(comm, 1.0, replicated=[(group, [model.shared])])
        optimizer.add_hook(hook)
        optimizer.update()
        groups = range((comm.size + 1) // 2)
        squares = (sum(2 * (r + 1.0) ** 2 for r in range(comm.size))
                   + sum(4 * (10.0 + g) ** 2 + 3 * (5.0 + g) ** 2 for g in groups))
        assert hook.norm == pytest.approx(np.sqrt(squares), rel=1e-14)
        rate = 1.0 / hook.norm
        np.testing.assert_allclose(model.own.grad, (comm.rank + 1.0) * rate, rtol=1e-14)
        np.testing.assert_allclose(model.declared.w.grad, (5.0 + color) * rate, rtol=1e-14)
    finally:
        group.finalize()


@pytest.mark.mpi
def test_below_the_threshold_nothing_changes(comm):
    link = chainer.Link()
    with link.init_scope():
        link.w = chainer.Parameter(np.zeros(2))
    link.w.grad = np.full(2, 1e-3)
    optimizer = chainer.optimizers.SGD(0.0).setup(link)
    hook = GradientClipping(comm, 1.0)
    optimizer.add_hook(hook)
    optimizer.update()
    assert hook.norm == pytest.approx(np.sqrt(2e-6 * comm.size), rel=1e-14)
    np.testing.assert_array_equal(link.w.grad, np.full(2, 1e-3))


# -- chainer's own hook on a piece warns once ---------------------------------------


def updated_twice(target, hook):
    """Two updates of ``target`` (gradients set by hand) with ``hook``: the warnings."""
    optimizer = chainer.optimizers.SGD(0.1).setup(target)
    optimizer.add_hook(hook)
    found = []
    for _ in range(2):
        for p in target.params():
            p.grad = np.ones_like(p.array)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optimizer.update()
        found.append([w for w in caught if issubclass(w.category, ClippingWarning)])
    return found


@pytest.mark.mpi(min_size=2)
def test_chainer_s_hook_on_a_piece_warns_once_naming_the_mnpar_hook(comm):
    piece = mnpar.MultiNodeChainList(comm)
    piece.add_link(L.Linear(3, 3), None, (comm.rank + 1) % comm.size)
    first, second = updated_twice(L.Classifier(piece),
                                  chainer.optimizer_hooks.GradientClipping(2.0))
    assert len(first) == 1 and not second
    assert "mnpar.optimizer_hooks.GradientClipping(comm, 2.0)" in str(first[0].message)
    assert "/predictor (MultiNodeChainList)" in str(first[0].message)


@pytest.mark.mpi(min_size=2)
def test_chainer_s_hook_on_a_pipeline_stage_warns(comm):
    stage = build_stage(chainer.Sequential(*parts(comm.size)), [1] * comm.size, comm)
    first, _ = updated_twice(stage, chainer.optimizer_hooks.GradientClipping(2.0))
    assert len(first) == 1


def test_chainer_s_hook_on_a_whole_model_stays_quiet(comm):
    whole = mnpar.MultiNodeChainList(comm)
    whole.add_link(L.Linear(3, 3), None, None)  # the whole model on this rank
    for target in (whole, L.Linear(3, 3)):
        assert updated_twice(target, chainer.optimizer_hooks.GradientClipping(2.0)) == [[], []]


def test_bad_arguments_are_refused(comm):
    with pytest.raises(TypeError, match="GradientClipping needs an mnpar communicator"):
        GradientClipping(comm.mpi_comm, 1.0)
    with pytest.raises(ValueError, match="threshold=0 must be a positive number"):
        GradientClipping(comm, 0)
    with pytest.raises(TypeError, match=r"replicated\[0\] must be a \(communicator, link or "
                                        r"parameters\) pair, not \w*Communicator"):
        GradientClipping(comm, 1.0, replicated=[comm])
    with pytest.raises(TypeError, match=r"replicated\[0\] lists a ndarray"):
        GradientClipping(comm, 1.0, replicated=[(comm, [np.ones(2)])])
