"""GPU paths: cupy arrays through the transport, the differentiable functions, pure_nccl.

Marked ``gpu``: skipped without cupy and a CUDA device, so CI (which has no
GPU) skips them all. Each rank uses device ``intra_rank % device count``;
NCCL allows one rank per device, so the pure_nccl tests are marked ``nccl``
and skip where ranks outnumber devices (tests/conftest.py decides both).
"""
import contextlib

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from helpers import Identity

import mnpar
import mnpar.functions as mf
from mnpar.communicators import _nccl

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=1)]


@pytest.fixture
def cupy():
    """The cupy module (the ``gpu`` marker has made sure of it and of a device)."""
    import cupy

    return cupy


def use_device(comm, cp) -> int:
    device = comm.intra_rank % cp.cuda.runtime.getDeviceCount()
    cp.cuda.Device(device).use()
    return device


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("shape", [(3, 4), (512, 1024)])  # inline, and header plus payload
def test_cupy_arrays_arrive_on_the_receivers_device(cupy, shape):
    comm = mnpar.create_communicator("naive", timeout=60)
    device = use_device(comm, cupy)
    x = cupy.arange(np.prod(shape), dtype=cupy.float32).reshape(shape)
    if comm.rank == 0:
        comm.send(x + 1, 1)
        got = comm.recv(1)
    elif comm.rank == 1:
        got = comm.recv(0)
        comm.send(got * 2, 0)
    if comm.rank < 2:
        assert isinstance(got, cupy.ndarray) and got.device.id == device
        want = (x + 1) * (2 if comm.rank == 0 else 1)
        cupy.testing.assert_array_equal(got, want)
    comm.finalize()


@pytest.mark.mpi(min_size=2)
def test_gpu_messages_staged_in_pinned_memory_arrive_intact(cupy):
    # Sender and receiver stage GPU payloads in page-locked memory that cupy's
    # pool hands out again at once: message after message must arrive whole,
    # strided, empty and several-array messages included.
    comm = mnpar.create_communicator("naive", timeout=60)
    use_device(comm, cupy)
    big = cupy.arange(300 * 257, dtype=cupy.float32).reshape(300, 257)
    messages = [big[:, ::2], cupy.zeros((0, 5), cupy.int32),
                (big, big.T.astype(cupy.float64), cupy.ones(3, cupy.int8))]
    for step in range(3):
        for i, msg in enumerate(messages):
            sent = tuple(m + step for m in msg) if isinstance(msg, tuple) else msg + step
            if comm.rank == 0:
                comm.send(sent, 1, tag=i)
            elif comm.rank == 1:
                got = comm.recv(0, tag=i)
                want = sent if isinstance(sent, tuple) else (sent,)
                got = got if isinstance(got, tuple) else (got,)
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    assert isinstance(g, cupy.ndarray) and g.dtype == w.dtype
                    cupy.testing.assert_array_equal(g, w)
    comm.finalize()


@pytest.mark.mpi(min_size=2)
def test_small_gpu_messages_go_through_the_host_even_where_mpi_is_cuda_aware(cupy):
    # One message that never waits: with cuda_aware=True a small cupy array
    # must still not hand device memory to MPI (the PyPI MPICH here is not
    # CUDA-aware, so doing so would fail).
    comm = mnpar.create_communicator("naive", timeout=60, cuda_aware=True)
    use_device(comm, cupy)
    x = cupy.arange(12, dtype=cupy.float16).reshape(3, 4)
    if comm.rank == 0:
        comm.send((x, x.astype(cupy.int8)), 1)
    elif comm.rank == 1:
        got = comm.recv(0)
        assert [type(g) for g in got] == [cupy.ndarray, cupy.ndarray]
        cupy.testing.assert_array_equal(got[0], x)
        assert got[1].dtype == cupy.int8
    comm.finalize()


@pytest.mark.mpi(min_size=2)
def test_seed_mlp_on_gpus_equals_one_process(cupy):
    # The tutorial's loop (rank 0: l1, rank 1: l2) with cupy Variables; the
    # gradients equal those of the whole model in one process on the CPU.
    comm = mnpar.create_communicator("naive", timeout=60)
    device = use_device(comm, cupy)
    with chainer.using_config("dtype", np.float64):
        check_seed_mlp(comm, device, cupy)
    comm.finalize()


def check_seed_mlp(comm, device, cupy):
    rng = np.random.RandomState(0)
    w1, w2 = rng.randn(5, 4), rng.randn(3, 5)
    x, t = rng.randn(6, 4), rng.randint(0, 3, 6).astype(np.int32)
    l1, l2 = L.Linear(4, 5, initialW=w1), L.Linear(5, 3, initialW=w2)
    whole = F.softmax_cross_entropy(l2(F.relu(l1(x))), t)
    whole.backward()
    mine = L.Linear(4, 5, initialW=w1) if comm.rank == 0 else L.Linear(5, 3, initialW=w2)
    mine.to_device(f"@cupy:{device}")
    if comm.rank == 0:
        phi = mf.send(F.relu(mine(cupy.asarray(x))), comm, 1)
        y = mf.recv(comm, 1, delegate_variable=phi)
        loss = F.softmax_cross_entropy(y, cupy.asarray(t))
        loss.backward()
        np.testing.assert_allclose(float(loss.array), float(whole.array), rtol=1e-10)
        np.testing.assert_allclose(mine.W.grad.get(), l1.W.grad, rtol=1e-8, atol=1e-12)
    elif comm.rank == 1:
        phi = mf.send(mine(mf.recv(comm, 0)), comm, 0)
        phi.backward()
        np.testing.assert_allclose(mine.W.grad.get(), l2.W.grad, rtol=1e-8, atol=1e-12)


@pytest.mark.nccl
@pytest.mark.parametrize("wire", [None, np.float16])
def test_pure_nccl_averages_gpu_gradients(cupy, wire):
    comm = mnpar.create_communicator("pure_nccl", allreduce_grad_dtype=wire)
    device = use_device(comm, cupy)
    model = L.Linear(3, 2)
    model.to_device(f"@cupy:{device}")
    model.W.grad = cupy.full((2, 3), comm.rank + 1, cupy.float32)
    model.b.grad = cupy.full((2,), 2 * (comm.rank + 1), cupy.float32)
    comm.multi_node_mean_grad(model)
    mean = (comm.size + 1) / 2
    assert model.W.grad.dtype == cupy.float32
    np.testing.assert_allclose(model.W.grad.get(), np.full((2, 3), mean), rtol=1e-3)
    np.testing.assert_allclose(model.b.grad.get(), np.full((2,), 2 * mean), rtol=1e-3)
    comm.finalize()


@pytest.mark.nccl
def test_pure_nccl_rejects_cpu_gradients():
    comm = mnpar.create_communicator("pure_nccl")
    model = L.Linear(3, 2)
    model.W.grad = np.ones((2, 3), np.float32)
    model.b.grad = np.ones(2, np.float32)
    with pytest.raises(TypeError, match="pure_nccl reduces GPU gradients only"):
        comm.multi_node_mean_grad(model)
    comm.finalize()


def test_the_default_takes_nccl_where_every_rank_has_a_gpu(cupy):
    comm = mnpar.create_communicator()
    try:
        enough = cupy.cuda.runtime.getDeviceCount() >= comm.intra_size
        assert comm.name == ("pure_nccl" if enough and _nccl.nccl_usable() else "hierarchical")
    finally:
        comm.finalize()



@pytest.mark.parametrize("ranks_per_node", ["1", "2"])
def test_hierarchical_averages_gpu_gradients(cupy, monkeypatch, ranks_per_node):
    # Simulated nodes of 2: NCCL inside the node where each rank has its own
    # GPU, the host buffer where they share one; nodes of 1: leaders only.
    monkeypatch.setenv("MNPAR_RANKS_PER_NODE", ranks_per_node)
    comm = mnpar.create_communicator("hierarchical", timeout=60)
    device = use_device(comm, cupy)
    model = L.Linear(3, 2)
    model.to_device(f"@cupy:{device}")
    for step in range(2):
        model.W.grad = cupy.full((2, 3), comm.rank + step, cupy.float32)
        model.b.grad = cupy.full((2,), comm.rank + 2 * step, cupy.float32)
        comm.multi_node_mean_grad(model)
        mean = (comm.size - 1) / 2
        assert isinstance(model.W.grad, cupy.ndarray) and model.W.grad.device.id == device
        np.testing.assert_allclose(model.W.grad.get(), np.full((2, 3), mean + step))
        np.testing.assert_allclose(model.b.grad.get(), np.full((2,), mean + 2 * step))
    comm.finalize()


@pytest.mark.mpi(min_size=2)
def test_gpu_and_cpu_gradients_across_ranks_fail_on_every_rank(cupy):
    comm = mnpar.create_communicator("flat", timeout=60)
    device = use_device(comm, cupy)
    model = L.Linear(3, 2)
    if comm.rank == 0:
        model.to_device(f"@cupy:{device}")
    model.W.grad = model.xp.ones((2, 3), np.float32)
    model.b.grad = model.xp.ones((2,), np.float32)
    with pytest.raises(ValueError, match=r"'/W': rank 0 has \(\(2, 3\), 'float32', 'on a GPU'\)"):
        comm.multi_node_mean_grad(model)
    comm.finalize()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb1"])
def test_pipeline_on_gpus_equals_one_process(cupy, schedule):
    # The seed loop (rank 0: l1 and the loss, rank 1: l2) in 2 micro-batches,
    # activations and gradients crossing through the host: one SGD step
    # equals the same step of the whole model in one process on the CPU.
    from mnpar.pipeline import PipelineUpdater

    comm = mnpar.create_communicator("naive", timeout=60)
    device = use_device(comm, cupy)
    rng = np.random.RandomState(0)
    w1, w2 = rng.randn(5, 4), rng.randn(3, 5)
    x, t = rng.randn(8, 4), rng.randint(0, 3, 8).astype(np.int32)
    with chainer.using_config("dtype", np.float64):
        whole = L.Classifier(chainer.Sequential(L.Linear(4, 5, initialW=w1), F.relu,
                                                L.Linear(5, 3, initialW=w2)))
        chainer.optimizers.SGD(0.5).setup(whole).update(whole, x, t)
        mine = L.Linear(4, 5, initialW=w1) if comm.rank == 0 else L.Linear(5, 3, initialW=w2)
    model = mnpar.MultiNodeChainList(comm)
    data = chainer.datasets.TupleDataset(x, t)
    if comm.rank == 0:
        model.add_link(chainer.Sequential(mine, F.relu), None, 1)
        model.add_link(Identity(), 1, None)
        target, dataset = L.Classifier(model), data
    else:
        if comm.rank == 1:
            model.add_link(mine, 0, 0)
        target, dataset = model, mnpar.datasets.create_empty_dataset(data)
    target.to_device(f"@cupy:{device}")
    optimizer = chainer.optimizers.SGD(0.5).setup(target)
    it = chainer.iterators.SerialIterator(dataset, 8, shuffle=False)
    updater = PipelineUpdater(it, optimizer, comm, 2, schedule=schedule,
                              device=f"@cupy:{device}" if comm.rank == 0 else None)
    updater.update()
    updater.finalize()
    if comm.rank < 2:
        want = whole.predictor[0 if comm.rank == 0 else 2]
        assert isinstance(mine.W.array, cupy.ndarray)
        np.testing.assert_allclose(mine.W.array.get(), want.W.array, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(mine.b.array.get(), want.b.array, rtol=1e-10, atol=1e-12)
    comm.finalize()


class _SpatialNet(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(2, 4, 3, pad=1)
            self.bn = L.BatchNormalization(4)
            self.up = L.Deconvolution2D(4, 2, 4, stride=2, pad=1)

    def forward(self, x):
        return self.up(F.max_pooling_2d(F.relu(self.bn(self.conv(x))), 2))


@pytest.mark.mpi(min_size=2)
def test_spatial_cnn_on_gpus_equals_one_process(cupy):
    # A converted CNN's tiles on each rank's GPU (halos through host
    # buffers): outputs and parameter gradients equal the whole image's on
    # the CPU in one process.
    import copy

    comm = mnpar.create_communicator("naive", timeout=60)
    device = use_device(comm, cupy)
    grid = mnpar.spatial.SpatialGrid(comm, (1, comm.size))
    with chainer.using_config("dtype", np.float64):
        np.random.seed(0)
        whole = _SpatialNet()
    net = mnpar.spatial.convert(copy.deepcopy(whole), grid)
    net.to_device(f"@cupy:{device}")
    rng = np.random.RandomState(1)
    x, t = rng.randn(2, 2, 17, 23), rng.randn(2, 2, 18, 24)
    F.mean_squared_error(whole(x), t).backward()
    y = net(cupy.asarray(grid.tile(x)))
    mnpar.spatial.mean_squared_error(y, cupy.asarray(grid.tile(t)), grid).backward()
    np.testing.assert_allclose(y.array.get(), grid.tile(whole(x).array), rtol=1e-10, atol=1e-12)
    for (name, p), (_, q) in zip(sorted(net.namedparams()), sorted(whole.namedparams())):
        np.testing.assert_allclose(p.grad.get(), q.grad, rtol=1e-8, atol=1e-12, err_msg=name)
    comm.finalize()


def test_philox_on_a_gpu_gives_the_cpus_integers_and_uniforms(cupy):
    # The array operations of mnpar.random on cupy: the same words and uniforms as on NumPy.
    from mnpar.random import _philox

    starts = np.array([0, 7, 1000, 12345], np.uint64)
    on_cpu = _philox._short_runs(starts, 37, 3, (11, 13), np)
    on_gpu = _philox._short_runs(cupy.asarray(starts), 37, 3, (11, 13), cupy)
    assert isinstance(on_gpu, cupy.ndarray)
    assert np.array_equal(on_gpu.get(), on_cpu)
    np.testing.assert_allclose(_philox.normal(cupy.asarray(starts), 5, 3, (1, 2), cupy).get(),
                               _philox.normal(starts, 5, 3, (1, 2)), rtol=1e-13)


def test_random_functions_on_a_gpu_draw_the_cpus_masks_under_a_scope(cupy):
    # Dropout (never cuDNN's under a scope), zoneout and rrelu on GPU arrays, whole and in
    # two micro-batches: the masks one process draws on the CPU.
    from mnpar.random import _position

    class Noisy(chainer.Link):
        def forward(self, h):
            return F.rrelu(F.zoneout(h * 2, F.dropout(h, 0.4), 0.3))

    model = Noisy()
    x = np.random.RandomState(0).randn(6, 5)
    with mnpar.random.scope(model, seed=2):
        on_cpu = model(x).array
        parts = []
        for before, n in ((0, 2), (2, 4)):
            with _position.batch_share(before, n, 6):
                parts.append(model(cupy.asarray(x[before:before + n])).array.get())
    np.testing.assert_allclose(np.concatenate(parts), on_cpu, rtol=1e-14)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("scoped", [False, True])
def test_a_recomputed_forward_on_a_gpu_draws_its_first_runs_masks(cupy, scoped):
    # Every dropout mask a recomputed segment draws again equals its first run's, without a
    # scope (cupy's generator replayed, cuDNN's states kept out) and with one.
    from mnpar.pipeline import PipelineUpdater, build_stage

    comm = mnpar.create_communicator("naive", timeout=60)
    device = f"@cupy:{use_device(comm, cupy)}"
    masks = []

    class Record(chainer.FunctionHook):
        name = "record-masks"

        def forward_postprocess(self, function, in_data):
            if type(function).__name__ == "Dropout":
                masks.append((chainer.config.in_recomputing, function.mask.get()))

    np.random.seed(0)
    whole = chainer.Sequential(L.Linear(4, 64), F.dropout, L.Linear(64, 64),
                               lambda h: F.dropout(h, 0.3), L.Linear(64, 3))
    stage = build_stage(whole, {2: [2, 3], 3: [1, 2, 2], 4: [1, 1, 1, 2]}[comm.size], comm)
    target = (L.Classifier(stage) if comm.rank == 0 else stage).to_device(device)
    rng = np.random.RandomState(1)
    data = chainer.datasets.TupleDataset(rng.randn(8, 4).astype(np.float32),
                                         rng.randint(0, 3, 8).astype(np.int32))
    if comm.rank != 0:
        data = mnpar.datasets.create_empty_dataset(data)
    optimizer = chainer.optimizers.SGD(0.1).setup(target)
    updater = PipelineUpdater(chainer.iterators.SerialIterator(data, 8, shuffle=False),
                              optimizer, comm, 2, checkpoint="always",
                              device=device if comm.rank == 0 else None)
    with Record(), (mnpar.random.scope(whole, optimizer, seed=1) if scoped
                    else contextlib.nullcontext()):
        updater.update()
    updater.finalize()
    first = [m for again, m in masks if not again]
    second = [m for again, m in masks if again]
    assert len(first) == len(second) > 0
    for a in first:  # the recomputations run in another order than the first runs
        assert any(np.array_equal(a, b) for b in second)
    comm.finalize()
