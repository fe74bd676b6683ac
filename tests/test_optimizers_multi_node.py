"""create_multi_node_optimizer: data-parallel updates equal single-process ones."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import mnpar

ROWS = 3  # examples per rank
NAMES = ("naive", "flat", "hierarchical")


class Net(chainer.Chain):
    def __init__(self, seed: int) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(5, 4)
            self.l2 = L.Linear(4, 3)
            self.unused = L.Linear(2, 2)  # never called: its gradient stays None
        rng = np.random.RandomState(seed)
        for p in self.params():
            p.array[...] = rng.standard_normal(p.shape).astype(np.float32)

    def forward(self, x, t):
        return F.softmax_cross_entropy(self.l2(F.relu(self.l1(x))), t)


def batch(step: int, lo: int, hi: int):
    """Rows ``lo:hi`` of the global batch of ``step`` (the same on every rank)."""
    rng = np.random.RandomState(100 + step)
    x = rng.standard_normal((64, 5)).astype(np.float32)
    t = rng.randint(0, 3, 64).astype(np.int32)
    return x[lo:hi], t[lo:hi]


def local(comm, step):
    return batch(step, comm.rank * ROWS, (comm.rank + 1) * ROWS)


def whole(comm, step):
    return batch(step, 0, comm.size * ROWS)


def params(model):
    return {n: p.array.copy() for n, p in model.namedparams()}


def assert_same(model, ref):
    for name, p in ref.namedparams():
        np.testing.assert_allclose(dict(model.namedparams())[name].array, p.array,
                                   rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.fixture(params=NAMES)
def dp_comm(request):
    c = mnpar.create_communicator(request.param, timeout=30)
    yield c
    c.finalize()


@pytest.mark.mpi(min_size=1)
def test_one_update_equals_single_process_on_concatenated_batch(dp_comm):
    model, ref = Net(0), Net(0)
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.1), dp_comm)
    assert opt.setup(model) is opt
    ref_opt = chainer.optimizers.MomentumSGD(lr=0.1).setup(ref)
    for step in range(3):
        opt.update(model, *local(dp_comm, step))
        ref_opt.update(ref, *whole(dp_comm, step))
        assert_same(model, ref)
    assert opt.t == 3


@pytest.mark.mpi(min_size=1)
def test_gradients_computed_by_the_caller_are_averaged(comm):
    model, ref = Net(0), Net(0)
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.5), comm).setup(model)
    ref_opt = chainer.optimizers.SGD(lr=0.5).setup(ref)
    model.cleargrads()
    model(*local(comm, 0)).backward()
    opt.update()
    ref_opt.update(ref, *whole(comm, 0))
    assert_same(model, ref)


@pytest.mark.mpi(min_size=2)
def test_first_update_only_broadcasts_when_ranks_started_apart(comm):
    # Rank 1's gradients were computed on its own weights: applying them would be wrong.
    model, ref = Net(comm.rank), Net(0)
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.5), comm).setup(model)
    opt.update(model, *local(comm, 0))
    assert_same(model, ref)
    assert opt.t == 0
    opt.update(model, *local(comm, 1))
    chainer.optimizers.SGD(lr=0.5).setup(ref).update(ref, *whole(comm, 1))
    assert_same(model, ref)


class Spy:
    """A communicator that records which gradients each mean_grad call saw."""

    def __init__(self, comm):
        self.comm, self.seen = comm, []

    def multi_node_mean_grad(self, model, zero_fill=False):
        self.comm.multi_node_mean_grad(model, zero_fill)
        self.seen.append(model.unused.W.grad)

    def __getattr__(self, name):
        return getattr(self.comm, name)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("zero_fill", [True, False])
def test_zero_fill_decides_whether_unused_parameters_take_part(comm, zero_fill):
    model, spy = Net(0), Spy(comm)
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(), spy, zero_fill=zero_fill)
    opt.setup(model).update(model, *local(comm, 0))
    if zero_fill:
        np.testing.assert_array_equal(spy.seen[0], 0)
    else:
        assert spy.seen == [None]


@pytest.mark.mpi(min_size=1)
def test_lazily_initialized_link_is_broadcast_when_it_appears(comm):
    np.random.seed(comm.rank)  # lazily drawn weights differ across ranks
    model = chainer.Sequential(L.Linear(None, 3))
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(), comm).setup(model)
    x, t = local(comm, 0)
    opt.update(lambda: F.softmax_cross_entropy(model(x), t))
    weights = comm.allgather(model[0].W.array)
    for w in weights[1:]:
        np.testing.assert_array_equal(w, weights[0])


@pytest.mark.mpi(min_size=1)
def test_attributes_reach_the_wrapped_optimizer(comm):
    actual = chainer.optimizers.SGD(lr=0.1)
    opt = mnpar.create_multi_node_optimizer(actual, comm).setup(Net(0))
    opt.lr = 0.25
    assert actual.lr == 0.25 and opt.lr == 0.25
    assert opt.target is actual.target
    assert opt.communicator is comm


def test_rejects_what_is_not_a_communicator():
    with pytest.raises(TypeError, match="must be an mnpar communicator, not object"):
        mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(), object())


@pytest.mark.mpi(min_size=1)
def test_standard_updater_drives_the_wrapper(comm):
    model, ref = Net(0), Net(0)
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), comm).setup(model)
    x, t = local(comm, 0)
    it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), ROWS,
                                          shuffle=False)
    chainer.training.StandardUpdater(it, opt).update()
    chainer.optimizers.Adam().setup(ref).update(ref, *whole(comm, 0))
    assert_same(model, ref)
