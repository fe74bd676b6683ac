"""MultiNodeBatchNormalization and create_mnbn_model equal chainer's BatchNormalization
run in one process on the ranks' concatenated batch."""
import copy
import io

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import mnpar
from mnpar.links import MultiNodeBatchNormalization, create_mnbn_model

pytestmark = pytest.mark.mpi(min_size=1)

# x dtype, link dtype, tolerance
DTYPES = [(np.float16, None, 2e-2), (np.float32, None, 1e-5), (np.float64, np.float64, 1e-10)]


def counts_of(comm, layout):
    """Examples per rank: 3 each, or rank r has r + 2."""
    return [3 if layout == "equal" else r + 2 for r in range(comm.size)]


def rows(counts, rank):
    lo = sum(counts[:rank])
    return slice(lo, lo + counts[rank])


def pair(comm, size=3, dtype=None, seed=0, backend="auto", **kwargs):
    """chainer's BatchNormalization and ours, with the same random gamma and beta."""
    ref = L.BatchNormalization(size, dtype=dtype, **kwargs)
    ours = MultiNodeBatchNormalization(size, comm, dtype=dtype, communication_backend=backend,
                                       **kwargs)
    rng = np.random.RandomState(seed)
    for name in ("gamma", "beta"):
        p = getattr(ref, name, None)
        if p is not None:
            p.array[...] = rng.uniform(0.5, 1.5, p.shape)
            getattr(ours, name).array[...] = p.array
    return ref, ours


def data(rng, n, shape, dtype):
    """Examples away from zero (mean 3, std 2), and weights for the loss."""
    x = (rng.standard_normal((n,) + shape) * 2 + 3).astype(dtype)
    return x, rng.standard_normal(x.shape).astype(dtype)


def run(link, x, w, **kwargs):
    """One forward and backward of ``sum(link(x) * w)``; returns ``y`` and ``gx``."""
    link.cleargrads()
    x = chainer.Variable(x)
    y = link(x, **kwargs)
    F.sum(y * w).backward()
    return y.array, x.grad


def close(actual, expected, tol, what=""):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=tol, atol=tol, err_msg=what)


def assert_same_state(ours, ref, tol):
    close(ours.avg_mean, ref.avg_mean, tol, "avg_mean")
    close(ours.avg_var, ref.avg_var, tol, "avg_var")
    assert ours.N == ref.N


@pytest.mark.parametrize("shape", [(3,), (3, 2, 2)])
@pytest.mark.parametrize("x_dtype, dtype, tol", DTYPES)
@pytest.mark.parametrize("layout", ["equal", "unequal"])
def test_training_equals_one_process_on_the_concatenated_batch(mcomm, layout, x_dtype, dtype,
                                                               tol, shape):
    counts = counts_of(mcomm, layout)
    mine = rows(counts, mcomm.rank)
    ref, ours = pair(mcomm, dtype=dtype)
    rng = np.random.RandomState(1)
    for step in range(3):
        x, w = data(rng, sum(counts), shape, x_dtype)
        y_ref, gx_ref = run(ref, x, w)
        y, gx = run(ours, x[mine], w[mine])
        assert y.dtype == x_dtype and gx.dtype == x_dtype
        close(y, y_ref[mine], tol, f"y, step {step}")
        close(gx, gx_ref[mine], tol, f"gx, step {step}")
        # gamma's and beta's gradients: the mean over ranks of each rank's sum
        close(ours.gamma.grad * mcomm.size, ref.gamma.grad, tol * 10, "ggamma")
        close(ours.beta.grad * mcomm.size, ref.beta.grad, tol * 10, "gbeta")
        assert_same_state(ours, ref, tol)


def one_step_equals_one_process(mcomm, counts, shape, seed, ref, ours):
    """One float32 step of ``ours`` on this rank's rows equals ``ref`` on all of them."""
    mine = rows(counts, mcomm.rank)
    x, w = data(np.random.RandomState(seed), sum(counts), shape, np.float32)
    y_ref, gx_ref = run(ref, x, w)
    y, gx = run(ours, x[mine], w[mine])
    close(y, y_ref[mine], 1e-5)
    close(gx, gx_ref[mine], 1e-5)
    assert_same_state(ours, ref, 1e-5)


@pytest.mark.mpi(min_size=2)
def test_a_rank_without_examples_takes_part(mcomm):
    counts = [0] + [3] * (mcomm.size - 1)
    one_step_equals_one_process(mcomm, counts, (3,), 2, *pair(mcomm))


def test_channels_of_several_axes(mcomm):
    counts = counts_of(mcomm, "unequal")
    one_step_equals_one_process(mcomm, counts, (3, 2, 4), 3, *pair(mcomm, size=(3, 2)))


def test_without_gamma_and_beta(mcomm):
    ref, ours = pair(mcomm, use_gamma=False, use_beta=False)
    assert list(ours.params()) == []
    one_step_equals_one_process(mcomm, counts_of(mcomm, "unequal"), (3,), 4, ref, ours)


def test_finetuning_accumulates_population_statistics(mcomm):
    counts = counts_of(mcomm, "unequal")
    mine = rows(counts, mcomm.rank)
    ref, ours = pair(mcomm)
    rng = np.random.RandomState(5)
    with chainer.no_backprop_mode():
        for _ in range(3):
            x, _w = data(rng, sum(counts), (3,), np.float32)
            ref(x, finetune=True)
            ours(x[mine], finetune=True)
            assert_same_state(ours, ref, 1e-5)
        assert ours.N == 3
        ours.start_finetuning()
        ref.start_finetuning()
        x, _w = data(rng, sum(counts), (3,), np.float32)
        ref(x, finetune=True)
        ours(x[mine], finetune=True)
    assert ours.N == 1
    assert_same_state(ours, ref, 1e-5)


def test_test_mode_uses_the_running_averages_without_communicating(mcomm):
    counts = counts_of(mcomm, "unequal")
    mine = rows(counts, mcomm.rank)
    ref, ours = pair(mcomm)
    x, w = data(np.random.RandomState(6), sum(counts), (3,), np.float32)
    run(ref, x, w)
    run(ours, x[mine], w[mine])
    x, w = data(np.random.RandomState(7), sum(counts), (3,), np.float32)
    if mcomm.rank == 0:  # alone: a collective here would wait for the others and time out
        with chainer.using_config("train", False):
            y_ref, gx_ref = run(ref, x, w)
            y, gx = run(ours, x[mine], w[mine])
        close(y, y_ref[mine], 1e-5)
        close(gx, gx_ref[mine], 1e-5)
        assert_same_state(ours, ref, 1e-5)
    mcomm.allgather_obj(None)  # the others wait here for rank 0


def test_the_first_test_mode_call_sees_chainers_initial_averages(comm):
    # avg_var starts at 1 as in chainer's link (ChainerMN's started at 0)
    ref, ours = pair(comm)
    x, w = data(np.random.RandomState(8), 4, (3,), np.float32)
    with chainer.using_config("train", False):
        close(run(ours, x, w)[0], run(ref, x, w)[0], 1e-6)


@pytest.mark.mpi(min_size=2)
def test_channels_that_differ_across_ranks_raise_on_every_rank(mcomm):
    ours = MultiNodeBatchNormalization(3 + mcomm.rank, mcomm)
    with pytest.raises(ValueError, match="same dtype and shape on every rank"):
        ours(np.ones((2, 3 + mcomm.rank), np.float32))


def test_second_order_gradients_are_refused(mcomm):
    ours = MultiNodeBatchNormalization(3, mcomm)
    x = chainer.Variable(np.random.RandomState(9).standard_normal((4, 3)).astype(np.float32))
    gx, = chainer.grad([F.sum(ours(x) ** 3)], [x], enable_double_backprop=True)
    with pytest.raises(NotImplementedError, match="no second-order gradients"):
        F.sum(gx).backward()


def test_deepcopy_shares_the_communicator_and_copies_the_arrays(comm):
    ours = MultiNodeBatchNormalization(3, comm, communication_backend="mpi")
    other = copy.deepcopy(ours)
    assert other.comm is comm
    assert other.avg_mean is not ours.avg_mean and other.gamma is not ours.gamma
    other.gamma.array[...] = 5
    assert (ours.gamma.array == 1).all()
    assert other._communication_backend == "mpi"


def test_running_averages_and_count_are_saved(comm):
    ours = MultiNodeBatchNormalization(3, comm)
    ours.avg_mean[...] = [1, 2, 3]
    ours.N = 4
    buf = io.BytesIO()
    chainer.serializers.save_npz(buf, ours)
    loaded = MultiNodeBatchNormalization(3, comm)
    buf.seek(0)
    chainer.serializers.load_npz(buf, loaded)
    assert loaded.avg_mean.tolist() == [1, 2, 3] and loaded.N == 4


def test_defaults_and_dtypes_follow_chainer(comm):
    ours = MultiNodeBatchNormalization(3, comm)
    assert (ours.decay, ours.eps, ours.N) == (0.9, 2e-5, 0)
    assert ours.gamma.dtype == ours.avg_mean.dtype == np.float32
    assert ours.avg_mean.tolist() == [0, 0, 0] and ours.avg_var.tolist() == [1, 1, 1]
    mixed = MultiNodeBatchNormalization(3, comm, dtype=chainer.mixed16, initial_gamma=2.0)
    assert mixed.gamma.dtype == mixed.avg_var.dtype == np.float32
    assert (mixed.gamma.array == 2).all()
    init = chainer.initializers.Constant(0.5)
    half = MultiNodeBatchNormalization((3, 2), comm, dtype=np.float16, initial_beta=init)
    assert half.beta.dtype == np.float16 and half.beta.shape == (3, 2)
    assert init.dtype is None  # the caller's initializer is left as it was


# -- create_mnbn_model ---------------------------------------------------------------


class Block(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(3, 3)
            self.bn = L.BatchNormalization(3)

    def forward(self, x):
        return F.relu(self.bn(self.l(x)))


class Net(chainer.Chain):
    """BatchNormalizations in a Chain, a Chain in a Sequential, the Sequential and a ChainList."""

    def __init__(self, seed):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(4, 3)
            self.bn1 = L.BatchNormalization(3)
            self.body = chainer.Sequential(Block(), F.tanh, L.Linear(3, 3),
                                           L.BatchNormalization(3, use_beta=False))
            self.tail = chainer.ChainList(L.BatchNormalization(3, decay=0.5), L.Linear(3, 2))
        rng = np.random.RandomState(seed)
        for p in self.params():
            p.array[...] = rng.uniform(-1, 1, p.shape)

    def forward(self, x):
        h = self.body(self.bn1(self.l1(x)))
        return self.tail[1](self.tail[0](h))


def links(model):
    return dict(model.namedlinks())


def bn_paths(model):
    """Where the BatchNormalizations are (chainer's Sequential numbers its links oddly)."""
    paths = sorted(p for p, link in links(model).items() if type(link) is L.BatchNormalization)
    assert len(paths) == 4
    return paths


def test_create_mnbn_model_replaces_every_batch_normalization_and_keeps_the_rest(comm):
    net = Net(0)
    with chainer.no_backprop_mode():
        net(np.random.RandomState(10).standard_normal((5, 4)).astype(np.float32))
    for path in bn_paths(net):
        links(net)[path].N = 7
    model = create_mnbn_model(net, comm)
    for path, link in links(model).items():
        original = links(net)[path]
        if path in bn_paths(net):
            assert isinstance(link, MultiNodeBatchNormalization), path
            assert type(original) is L.BatchNormalization  # the user's model is unchanged
            assert link.comm is comm
            assert (link.decay, link.eps, link.N) == (original.decay, original.eps, 7)
            assert link.avg_mean.tolist() == original.avg_mean.tolist()
            assert link.avg_var.tolist() == original.avg_var.tolist()
            assert link.avg_mean is not original.avg_mean
        else:
            assert type(link) is type(original), path
    assert sum(hasattr(links(model)[path], "beta") for path in bn_paths(net)) == 3
    theirs = dict(net.namedparams())
    ours = dict(model.namedparams())
    assert sorted(ours) == sorted(theirs)  # regression: Sequential.__setitem__ renamed them
    for name, p in ours.items():
        assert (p.array == theirs[name].array).all() and p is not theirs[name], name


def test_create_mnbn_model_of_a_single_link_or_a_sequential(comm):
    bn = L.BatchNormalization(3, eps=1e-3)
    single = create_mnbn_model(bn, comm)
    assert isinstance(single, MultiNodeBatchNormalization) and single.eps == 1e-3
    original = chainer.Sequential(L.Linear(2, 3), L.BatchNormalization(3), F.relu,
                                  L.Linear(3, 3), L.BatchNormalization(3, use_beta=False))
    seq = create_mnbn_model(original, comm)
    assert isinstance(seq[1], MultiNodeBatchNormalization)
    assert isinstance(seq[4], MultiNodeBatchNormalization)
    # regression: Sequential.__setitem__ moved the new link among the children,
    # so '/1/beta' became '/1/gamma' and the parameters no longer matched by name
    theirs = dict(original.namedparams())
    for name, p in seq.namedparams():
        assert p.shape == theirs[name].shape, name
    assert sorted(n for n, _ in seq.namedparams()) == sorted(theirs)
    plain = L.Linear(2, 2)
    assert type(create_mnbn_model(plain, comm)) is L.Linear
    assert create_mnbn_model(plain, comm) is not plain
    renorm = create_mnbn_model(L.BatchRenormalization(3), comm)
    assert type(renorm) is L.BatchRenormalization  # normalizes otherwise: left alone


@pytest.mark.parametrize("layout", ["equal", "unequal"])
def test_create_mnbn_model_trains_as_one_process(mcomm, layout):
    counts = counts_of(mcomm, layout)
    mine, total = rows(counts, mcomm.rank), sum(counts)
    model = create_mnbn_model(Net(0), mcomm)
    ref = Net(0)
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.1), mcomm)
    opt.setup(model)
    ref_opt = chainer.optimizers.MomentumSGD(lr=0.1).setup(ref)
    rng = np.random.RandomState(11)
    for _ in range(3):
        x = rng.standard_normal((total, 4)).astype(np.float32)
        t = rng.randint(0, 2, total).astype(np.int32)
        ref_opt.update(F.softmax_cross_entropy, ref(x), t)
        # each rank's share of the global mean loss, times size: the optimizer averages
        loss = F.sum(F.softmax_cross_entropy(model(x[mine]), t[mine], reduce="no"))
        opt.update(F.identity, loss * (mcomm.size / total))
    for name, p in ref.namedparams():
        close(dict(model.namedparams())[name].array, p.array, 1e-5, name)
    for path in bn_paths(ref):
        assert_same_state(links(model)[path], links(ref)[path], 1e-5)


# -- GPU ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "mpi", pytest.param("nccl", marks=pytest.mark.nccl)])
def test_on_the_gpu_equals_one_process(backend):
    import cupy as cp

    from mnpar.communicators import _nccl

    probe = mnpar.create_communicator("naive")
    size, rank = probe.size, probe.rank
    cp.cuda.Device(probe.intra_rank % cp.cuda.runtime.getDeviceCount()).use()
    probe.finalize()
    nccl = _nccl.nccl_usable() and size <= cp.cuda.runtime.getDeviceCount()
    comm = mnpar.create_communicator("pure_nccl" if nccl else "naive", timeout=60)
    try:
        counts = [r + 2 for r in range(size)]
        mine = rows(counts, rank)
        ref, ours = pair(comm, backend=backend)
        ours.to_gpu()
        x, w = data(np.random.RandomState(12), sum(counts), (3, 2), np.float32)
        y_ref, gx_ref = run(ref, x, w)
        y, gx = run(ours, cp.asarray(x[mine]), cp.asarray(w[mine]))
        close(y.get(), y_ref[mine], 1e-5)
        close(gx.get(), gx_ref[mine], 1e-5)
        close(ours.avg_var.get(), ref.avg_var, 1e-5)
        if nccl and backend == "nccl":
            with pytest.raises(TypeError, match="normalizes GPU arrays only"):
                MultiNodeBatchNormalization(3, comm, communication_backend="nccl")(x[mine])
    finally:
        comm.finalize()
