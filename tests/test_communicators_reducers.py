"""multi_node_mean_grad: every strategy gives the mean gradient, in any layout."""
import chainer
import chainer.links as L
import numpy as np
import pytest
from mpi4py import MPI

import mnpar
from mnpar.communicators import _hierarchical, _nccl, _pure_nccl, _reducers, _wait

pytestmark = pytest.mark.mpi(min_size=1)
CPU_NAMES = ["naive", "flat", "hierarchical"]


class Model(chainer.Chain):
    def __init__(self, dtype=np.float32):
        super().__init__()
        with self.init_scope():
            self.a = L.Linear(3, 4, initialW=np.ones((4, 3), dtype), initial_bias=0)
            self.b = L.Linear(4, 2, initialW=np.ones((2, 4), dtype), initial_bias=0)
            self.unused = L.Linear(None, 2)
        for p in self.params():
            if p.data is not None:
                p.data = p.data.astype(dtype)
        self.cleargrads()


def fill_grads(model, rank, skip_unused=True):
    for i, (name, p) in enumerate(sorted(model.namedparams())):
        if skip_unused and name.startswith("/unused"):
            continue
        if p.data is not None:
            p.grad = np.full(p.data.shape, rank + i, p.data.dtype)


@pytest.mark.parametrize("name", CPU_NAMES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_mean_of_every_rank(name, dtype):
    comm = mnpar.create_communicator(name)
    model = Model(dtype)
    for step in range(2):  # the second step reuses the packed buffer
        fill_grads(model, comm.rank + step)
        comm.multi_node_mean_grad(model)
        mean_rank = (comm.size - 1) / 2 + step
        for i, (name_, p) in enumerate(sorted(model.namedparams())):
            if name_.startswith("/unused"):
                assert p.grad is None
            else:
                assert p.grad.dtype == dtype
                np.testing.assert_allclose(p.grad, mean_rank + i, rtol=1e-3)
    comm.finalize()


@pytest.mark.parametrize("name", CPU_NAMES)
def test_zero_fill_gives_missing_gradients_zeros(name):
    comm = mnpar.create_communicator(name)
    model = Model()
    model.unused.W.initialize((2, 2))
    model.unused.W.grad = None
    fill_grads(model, comm.rank)
    comm.multi_node_mean_grad(model, zero_fill=True)
    np.testing.assert_array_equal(model.unused.W.grad, np.zeros((2, 2)))
    comm.finalize()


@pytest.mark.parametrize("name", CPU_NAMES)
def test_changed_layout_does_not_corrupt_gradients(name):
    # Regression: a packed buffer reused for a different set of parameters
    # would overwrite gradients that are still views of it.
    comm = mnpar.create_communicator(name)
    model = Model()
    fill_grads(model, comm.rank)
    comm.multi_node_mean_grad(model)
    model.a.W.grad = None
    comm.multi_node_mean_grad(model)
    mean = (comm.size - 1) / 2
    for i, (n, p) in enumerate(sorted(model.namedparams())):
        if n in ("/a/b", "/b/W", "/b/b"):
            np.testing.assert_allclose(p.grad, mean + i, rtol=1e-6)
    comm.finalize()


def test_host_allreduces_go_in_parts(monkeypatch):
    # One large non-blocking allreduce runs far slower under MPICH than its parts
    # posted together (docs/scaling.rst); parts of ALLREDUCE_CHUNK bytes, the last short.
    monkeypatch.setattr(_reducers, "ALLREDUCE_CHUNK", 4096)
    comm = mnpar.create_communicator("flat")
    buf = np.full((100, 101), comm.rank + 1, np.float32)  # 40400 bytes: 9 parts and 1 short
    requests = comm._reducer._post(comm.mpi_comm, buf)
    assert len(requests) == 10
    MPI.Request.Waitall(requests)
    np.testing.assert_array_equal(buf, comm.size * (comm.size + 1) / 2)
    comm.finalize()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("ranks_per_node", ["1", "2"])
def test_hierarchical_across_simulated_nodes(monkeypatch, ranks_per_node):
    monkeypatch.setenv("MNPAR_RANKS_PER_NODE", ranks_per_node)
    comm = mnpar.create_communicator("hierarchical")
    k = int(ranks_per_node)
    assert comm.intra_size == min(k, comm.size - comm.rank // k * k)
    assert comm.inter_size == -(-comm.size // k)
    # Simulated nodes share one host's memory: waits keep their spin for it.
    assert _wait.SPIN_BANDWIDTH == _wait.SPIN_BANDWIDTH_NODE
    model = Model(np.float64)
    fill_grads(model, comm.rank)
    comm.multi_node_mean_grad(model)
    for i, (n, p) in enumerate(sorted(model.namedparams())):
        if not n.startswith("/unused"):
            np.testing.assert_allclose(p.grad, (comm.size - 1) / 2 + i)
    comm.finalize()


def test_bcast_data_copies_rank_zero_in_place():
    comm = mnpar.create_communicator("flat")
    model = Model(np.float64)
    for p in model.params():
        if p.data is not None:
            p.data[...] = comm.rank + 1
    arrays = [p.data for p in model.params() if p.data is not None]
    comm.bcast_data(model)
    for before, p in zip(arrays, [p for p in model.params() if p.data is not None]):
        assert p.data is before
        np.testing.assert_array_equal(p.data, 1)
    comm.finalize()


@pytest.mark.mpi(min_size=2)
def test_bcast_data_with_different_models_fails_on_every_rank():
    comm = mnpar.create_communicator("flat", timeout=10)
    model = Model() if comm.rank == 0 else L.Linear(3, 5)
    with pytest.raises(ValueError, match="bcast_data: the models differ across ranks"):
        comm.bcast_data(model)
    comm.finalize()


@pytest.mark.parametrize("name", CPU_NAMES)
def test_same_total_new_order_does_not_corrupt_gradients(name):
    # Regression: with shared rows, a second model of the same total size (as
    # a GAN's two networks on one communicator) wrote over the first one's
    # gradients, which were still views of the shared memory.
    comm = mnpar.create_communicator(name)
    a, b = Model(np.float64), Model(np.float64)
    fill_grads(a, comm.rank)
    comm.multi_node_mean_grad(a)
    expected = {n: p.grad.copy() for n, p in a.namedparams() if p.grad is not None}
    fill_grads(b, comm.rank + 5)
    comm.multi_node_mean_grad(b)
    for n, p in a.namedparams():
        if n in expected:
            np.testing.assert_array_equal(p.grad, expected[n])
    comm.finalize()


@pytest.mark.parametrize("name", CPU_NAMES)
def test_a_finished_mean_is_no_longer_held_for_finalize(name):
    # Regression: every mean started stayed on the list finalize completes, so a
    # training run kept every step's buffers and views, and finalize redid them all.
    comm = mnpar.create_communicator(name)
    model = Model()
    for step in range(3):
        fill_grads(model, comm.rank + step)
        comm.multi_node_mean_grad(model)
    pending = comm.start_mean_grad(model)
    assert comm._reducer._in_flight == [pending]
    comm.finalize()  # completes the one left in flight
    assert comm._reducer._in_flight == []


def test_gradients_outlive_finalize():
    # Regression: gradients viewing a freed shared window would crash on access.
    comm = mnpar.create_communicator("hierarchical")
    model = Model(np.float64)
    fill_grads(model, comm.rank)
    comm.multi_node_mean_grad(model)
    comm.finalize()
    np.testing.assert_allclose(model.b.W.grad, (comm.size - 1) / 2 + 2)


@pytest.mark.parametrize("name", CPU_NAMES)
@pytest.mark.parametrize("chunk", [None, 4100])  # bytes an allreduce part holds
def test_large_odd_sized_gradients_equal_the_mean(monkeypatch, name, chunk):
    # Sizes that cut node blocks and reduction chunks in the middle of a parameter.
    if chunk:
        monkeypatch.setattr(_reducers, "ALLREDUCE_CHUNK", chunk)
    comm = mnpar.create_communicator(name)
    link = chainer.Link()
    shapes = [(7, 10001), (150_003,), (3,), (64 * 1024 + 5,)]
    with link.init_scope():
        for i, shape in enumerate(shapes):
            setattr(link, f"p{i}", chainer.Parameter(np.zeros(shape, np.float32)))
    params = [getattr(link, f"p{i}") for i in range(len(shapes))]
    rng = np.random.default_rng(comm.rank)
    for _ in range(2):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        everyone = comm.mpi_comm.allgather(grads)
        for p, g in zip(params, grads):
            p.grad = g.copy()
        comm.multi_node_mean_grad(link)
        for i, p in enumerate(params):
            expected = np.mean([grads_of[i] for grads_of in everyone], axis=0)
            np.testing.assert_allclose(p.grad, expected, rtol=1e-5, atol=1e-6)
    comm.finalize()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", CPU_NAMES)
def test_gradients_that_differ_across_ranks_fail_on_every_rank(name):
    # Without the check, a rank with other gradients (or none) left its peers
    # waiting in the reduction until the timeout, or summed mismatched arrays.
    comm = mnpar.create_communicator(name, timeout=10)
    model = Model()
    fill_grads(model, comm.rank)
    comm.multi_node_mean_grad(model)  # the same layout everywhere: no error
    if comm.rank == 1:
        model.b.W.grad = None  # rank 1 has no gradient for /b/W
    with pytest.raises(ValueError, match="multi_node_mean_grad: .*'/b/W': rank 0 has "
                                         r"\(\(2, 4\), 'float32'\), rank 1 has no gradient"):
        comm.multi_node_mean_grad(model)
    model.cleargrads()
    if comm.rank != 0:
        fill_grads(model, comm.rank)  # only rank 0 has nothing to reduce
    with pytest.raises(ValueError, match="multi_node_mean_grad: the models differ"):
        comm.multi_node_mean_grad(model)
    fill_grads(model, comm.rank)
    comm.multi_node_mean_grad(model)  # agreeing again, it averages again
    np.testing.assert_allclose(model.a.W.grad, (comm.size - 1) / 2)  # /a/W: index 0
    comm.finalize()



def assert_means(model, size, shift):
    for i, (n, p) in enumerate(sorted(model.namedparams())):
        if not n.startswith("/unused"):
            np.testing.assert_allclose(p.grad, (size - 1) / 2 + shift + i, err_msg=n)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", CPU_NAMES)
@pytest.mark.parametrize("ranks_per_node", ["", "2"])
def test_a_mean_in_flight_keeps_its_buffer(monkeypatch, name, ranks_per_node):
    # Double buffering starts step k+1 while step k is still reduced: each
    # needs a buffer of its own, and a blocking mean of another model in
    # between must write over neither.
    if ranks_per_node:
        monkeypatch.setenv("MNPAR_RANKS_PER_NODE", ranks_per_node)
    else:
        monkeypatch.delenv("MNPAR_RANKS_PER_NODE", raising=False)
    comm = mnpar.create_communicator(name, timeout=30)
    model, other = Model(np.float64), Model(np.float64)
    for _ in range(2):  # the second round reuses the buffers
        fill_grads(model, comm.rank)
        first = comm.start_mean_grad(model)
        fill_grads(model, comm.rank + 10)  # replaced, not written into
        second = comm.start_mean_grad(model)
        fill_grads(other, comm.rank + 20)
        comm.multi_node_mean_grad(other)
        comm.finish_mean_grad(first)
        assert_means(model, comm.size, 0)
        first_means = [p.grad for n, p in sorted(model.namedparams()) if p.grad is not None]
        comm.finish_mean_grad(second)
        assert_means(model, comm.size, 10)
        assert_means(other, comm.size, 20)
        for i, g in enumerate(first_means):
            np.testing.assert_allclose(g, (comm.size - 1) / 2 + i)
    comm.finalize()

# -- the GPU paths' MPI halves, on CPUs ----------------------------------------
# NCCL needs GPUs (tests/test_gpu.py runs it). Here a stand-in with NcclGroup's
# calls, over MPI on NumPy arrays, runs everything around it: packing, the
# leaders' allreduce across (simulated) nodes, unpacking, and how the ranks
# decide whether and where to make an NCCL communicator.


class HostGroup:
    """NcclGroup's calls over MPI, on NumPy arrays."""

    def __init__(self, comm, device=0):
        self.comm, self.device = comm, device

    def allreduce(self, buf):
        self.comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM)

    def reduce(self, buf):
        out = np.empty_like(buf)
        self.comm.Reduce(buf, out, MPI.SUM, root=0)
        if self.comm.rank == 0:
            buf[...] = out

    def bcast(self, buf):
        self.comm.Bcast(buf, root=0)

    def free(self):
        pass


@pytest.mark.parametrize("ranks_per_node", ["1", "2", "3"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_hierarchical_gpu_path_averages_across_nodes(monkeypatch, ranks_per_node, dtype):
    monkeypatch.setenv("MNPAR_RANKS_PER_NODE", ranks_per_node)
    comm = mnpar.create_communicator("hierarchical", timeout=30)
    model = Model(dtype)
    for step in range(2):  # the second step reuses the packed buffer
        fill_grads(model, comm.rank + step)
        params = _reducers.grads_to_reduce(model.namedparams(), False)
        pending = _reducers.PendingMean(params)
        comm._reducer._start_group_on_gpus(params, HostGroup(comm._topology.intra), pending)
        comm._reducer.finish(pending)
        for i, (n, p) in enumerate(sorted(model.namedparams())):
            if not n.startswith("/unused"):
                assert p.grad.dtype == dtype
                np.testing.assert_allclose(p.grad, (comm.size - 1) / 2 + step + i, rtol=1e-3)
    comm.finalize()


def _stand_in_nccl(monkeypatch, usable, bus=lambda device: f"0000:{device:02x}:00.0"):
    """NCCL as if here: ``usable`` on this rank, each device at PCI bus ``bus(device)``."""
    made = []

    def group(comm, device):
        made.append(device)
        return HostGroup(comm, device)

    monkeypatch.setattr(_hierarchical, "NcclGroup", group)
    monkeypatch.setattr(_pure_nccl, "NcclGroup", group)
    monkeypatch.setattr(_hierarchical, "nccl_usable", lambda: usable)
    monkeypatch.setattr(_pure_nccl, "require_nccl", lambda: None)
    monkeypatch.setattr(_nccl, "bus_id", bus)
    return made


@pytest.mark.mpi(min_size=2)
def test_hierarchical_uses_nccl_only_where_every_rank_of_the_node_can(monkeypatch):
    comm = mnpar.create_communicator("hierarchical", timeout=30)
    made = _stand_in_nccl(monkeypatch, usable=comm.rank != 1)
    assert comm._reducer._node_nccl(device=comm.intra_rank) is None  # rank 1 has no NCCL
    assert made == []
    comm.finalize()
    comm = mnpar.create_communicator("hierarchical", timeout=30)
    made = _stand_in_nccl(monkeypatch, usable=True)
    assert comm._reducer._node_nccl(device=0) is None  # every rank on GPU 0
    comm.finalize()
    comm = mnpar.create_communicator("hierarchical", timeout=30)
    made = _stand_in_nccl(monkeypatch, usable=True)
    first = comm._reducer._node_nccl(device=comm.intra_rank)
    assert isinstance(first, HostGroup) and comm._reducer._node_nccl(comm.intra_rank) is first
    assert made == [comm.intra_rank]  # made once
    with pytest.raises(RuntimeError, match=f"moved from GPU {comm.intra_rank} to GPU 7"):
        comm._reducer._node_nccl(device=7)
    comm.finalize()


@pytest.mark.mpi(min_size=2)
def test_pure_nccl_refuses_ranks_sharing_a_gpu_on_every_rank(monkeypatch):
    # NCCL takes one rank per device; made at creation, as before, every rank
    # of a node got GPU 0, since ChainerMN's users pick a device afterwards.
    made = _stand_in_nccl(monkeypatch, usable=True)
    comm = mnpar.create_communicator("pure_nccl", timeout=30)
    assert made == []  # nothing is made before the first reduction
    device = 0 if comm.rank < 2 else comm.intra_rank  # ranks 0 and 1 share GPU 0
    with pytest.raises(RuntimeError, match=r"GPU of its own for every rank, but ranks \[0, 1\] "
                                           r"of one node \(intra_rank\) all use the GPU at PCI "
                                           r"bus 0000:00:00.0 \(their device 0\)"):
        comm._reducer.nccl_group(device)
    assert made == []
    comm.finalize()
    comm = mnpar.create_communicator("pure_nccl", timeout=30)
    group = comm._reducer.nccl_group(comm.intra_rank)
    assert made == [comm.intra_rank] and comm._reducer.nccl_group(comm.intra_rank) is group
    with pytest.raises(RuntimeError, match="moved from GPU"):
        comm._reducer.nccl_group(comm.intra_rank + 1)
    comm.finalize()


@pytest.mark.mpi(min_size=2)
def test_a_gpu_is_told_apart_by_its_bus_not_its_device_number(monkeypatch):
    # With CUDA_VISIBLE_DEVICES set per rank, every rank's own GPU is device 0:
    # distinct GPUs, so NCCL must be used ...
    comm = mnpar.create_communicator("hierarchical", timeout=30)
    _stand_in_nccl(monkeypatch, usable=True, bus=lambda device: f"0000:{comm.rank:02x}:00.0")
    assert isinstance(comm._reducer._node_nccl(device=0), HostGroup)
    comm.finalize()
    comm = mnpar.create_communicator("pure_nccl", timeout=30)
    assert isinstance(comm._reducer.nccl_group(0), HostGroup)
    comm.finalize()
    # ... and where every rank sees all GPUs but ranks 0 and 1 pick the same
    # one under different numbers (device 0 and 1), NCCL must not be.
    comm = mnpar.create_communicator("pure_nccl", timeout=30)
    _stand_in_nccl(monkeypatch, usable=True, bus=lambda device: "0000:3b:00.0" if device < 2
                   else f"0000:{device:02x}:00.0")
    with pytest.raises(RuntimeError, match=r"ranks \[0, 1\] of one node \(intra_rank\) all "
                                           r"use the GPU at PCI bus 0000:3b:00.0 "
                                           r"\(their device 0, 1\)"):
        comm._reducer.nccl_group(comm.intra_rank)
    comm.finalize()
    comm = mnpar.create_communicator("hierarchical", timeout=30)
    assert comm._reducer._node_nccl(device=comm.intra_rank) is None  # through the host
    comm.finalize()
