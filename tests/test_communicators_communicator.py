"""create_communicator and the Communicator's ChainerMN-named surface."""
import types

import numpy as np
import pytest
from helpers import without_cupy
from mpi4py import MPI

import mnpar
from mnpar.communicators import NAMES, _nccl, default_name, ranks_on_this_node

pytestmark = pytest.mark.mpi(min_size=1)


@pytest.mark.parametrize("name", ["naive", "flat", "hierarchical"])
def test_properties(name, world):
    comm = mnpar.create_communicator(name)
    assert (comm.rank, comm.size) == (world.rank, world.size)
    assert comm.mpi_comm is world
    assert 0 <= comm.intra_rank < comm.intra_size <= comm.size
    assert comm.inter_size == 1 and comm.inter_rank == 0  # one machine, no simulation
    assert comm.name == name and "rank" in repr(comm)
    comm.finalize()


@pytest.mark.skipif(_nccl.nccl_usable(), reason="this rank has NCCL and a GPU: test_gpu.py "
                    "checks the default there")
def test_default_is_hierarchical_without_a_gpu(world):
    assert default_name(world, ranks_on_this_node(world)) == "hierarchical"
    comm = mnpar.create_communicator()
    assert comm.name == "hierarchical"
    comm.finalize()


def fake_nccl(devices):
    """What ``require_nccl`` returns: a cupy whose runtime counts ``devices`` GPUs."""
    runtime = types.SimpleNamespace(getDeviceCount=lambda: devices)
    return lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))


def test_default_takes_nccl_only_with_a_gpu_for_every_rank_of_the_node(monkeypatch, world):
    # NCCL takes one rank per device: two ranks sharing one GPU must not get pure_nccl.
    monkeypatch.setattr(_nccl, "require_nccl", fake_nccl(1))
    on_node = ranks_on_this_node(world)
    assert on_node == world.size  # the tests run on one machine
    assert default_name(world, on_node) == ("pure_nccl" if world.size == 1 else "hierarchical")
    monkeypatch.setattr(_nccl, "require_nccl", fake_nccl(world.size))
    assert default_name(world, on_node) == "pure_nccl"


@pytest.mark.mpi(min_size=2)
def test_ranks_agree_on_the_default_when_only_some_have_nccl(monkeypatch, world):
    # Regression: each rank chose alone, so ranks with and without NCCL built
    # different communicators and hung in mismatched collectives.
    if world.rank == 0:
        monkeypatch.setattr(_nccl, "require_nccl", fake_nccl(8))
    assert default_name(world, 1) == "hierarchical"


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown communicator_name 'fast'.*'naive', 'flat', "
                                         r"'hierarchical', 'pure_nccl'"):
        mnpar.create_communicator("fast")
    assert NAMES == ("naive", "flat", "hierarchical", "pure_nccl")


def test_unknown_keyword_and_bad_options():
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['tiemout'\]"):
        mnpar.create_communicator("naive", tiemout=3)
    with pytest.raises(ValueError, match="allreduce_grad_dtype is supported by 'pure_nccl'"):
        mnpar.create_communicator("flat", allreduce_grad_dtype=np.float16)
    with pytest.raises(TypeError, match="mpi_comm must be an mpi4py communicator"):
        mnpar.create_communicator("naive", mpi_comm="world")
    with pytest.raises(ValueError, match="timeout=-1 must be positive"):
        mnpar.create_communicator("naive", timeout=-1)


def test_pure_nccl_without_cupy_is_a_clear_error():
    with without_cupy(), pytest.raises(RuntimeError, match="'pure_nccl' communicator needs cupy"):
        mnpar.create_communicator("pure_nccl")


@pytest.mark.parametrize("dtype, match", [
    (np.int32, "allreduce_grad_dtype=int32 cannot be reduced by NCCL here; use one of float16, "
               "float32, float64"),
    ("no such dtype", "allreduce_grad_dtype='no such dtype' is not a dtype"),
])
def test_pure_nccl_wire_dtype_is_checked_before_anything_else(dtype, match):
    # Checked before NCCL is looked for, so the mistake shows on any machine.
    with pytest.raises(TypeError, match=match):
        mnpar.create_communicator("pure_nccl", allreduce_grad_dtype=dtype)


def test_timeout_from_environment(monkeypatch):
    monkeypatch.setenv("MNPAR_TIMEOUT", "12.5")
    comm = mnpar.create_communicator("naive")
    assert comm.timeout == 12.5
    comm.finalize()
    comm = mnpar.create_communicator("naive", timeout=0)
    assert comm.timeout is None
    comm.finalize()


def test_split_gives_the_same_kind(world):
    comm = mnpar.create_communicator("hierarchical")
    sub = comm.split(comm.rank % 2, comm.rank)
    assert sub.name == "hierarchical"
    assert sub.size == len(range(comm.rank % 2, comm.size, 2))
    assert sub.rank == comm.rank // 2
    total = sub.allreduce(np.array([comm.rank]))
    assert int(total[0]) == sum(range(comm.rank % 2, comm.size, 2))
    sub.finalize()
    comm.finalize()


def test_user_communicator_is_duplicated(world):
    sub = world.Split(0, world.rank)
    comm = mnpar.create_communicator("naive", mpi_comm=sub)
    assert comm.mpi_comm is sub
    assert MPI.Comm.Compare(comm._t.comm, sub) == MPI.CONGRUENT
    comm.finalize()
    sub.Free()


@pytest.mark.parametrize("cls, name", [
    (mnpar.communicators.NaiveCommunicator, "naive"),
    (mnpar.communicators.FlatCommunicator, "flat"),
    (mnpar.communicators.HierarchicalCommunicator, "hierarchical"),
    (mnpar.communicators.NonCudaAwareCommunicator, "hierarchical"),
    (mnpar.communicators.MpiCommunicatorBase, "naive")])
def test_chainermn_classes_build_the_named_communicator(cls, name, world):
    # ChainerMN's tests and some users build NaiveCommunicator(mpi_comm) directly.
    comm = cls(world)
    assert isinstance(comm, mnpar.CommunicatorBase) and comm.name == name
    assert (comm.rank, comm.size) == (world.rank, world.size)
    half = comm.split(comm.rank % 2, comm.rank)
    assert type(half) is cls and half.size == (comm.size + 1 - comm.rank % 2) // 2
    half.finalize()
    comm.finalize()


def test_create_communicator_returns_the_class_of_the_name():
    comm = mnpar.create_communicator("non_cuda_aware")  # ChainerMN's name
    assert type(comm) is mnpar.communicators.NonCudaAwareCommunicator
    comm.finalize()
    comm = mnpar.create_communicator("flat", batched_copy=False)
    assert type(comm) is mnpar.communicators.FlatCommunicator and not comm.batched_copy
    comm.finalize()


def test_set_config_and_get_config(comm):
    assert comm.batched_copy and comm.get_config("batched_copy")
    comm.set_config("batched_copy", False)
    assert not comm.batched_copy and comm.get_config() == {"batched_copy": False}
    comm.set_config("batched_copy")
    assert comm.get_config("batched_copy")
    with pytest.raises(ValueError, match="unknown config 'blah'"):
        comm.set_config("blah")
    with pytest.raises(ValueError, match="unknown config 'blah'"):
        comm.get_config("blah")
    with pytest.raises(ValueError, match="'pure_nccl' only, not 'naive'"):
        comm.set_config("allreduce_grad_dtype", np.float16)


@pytest.mark.mpi(min_size=2)
def test_recv_obj_takes_any_tag_and_fills_a_status(comm):
    nxt, prv = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    comm.send_obj(("hi", comm.rank), nxt, tag=7)
    status = MPI.Status()
    assert comm.recv_obj(prv, status=status) == ("hi", prv)
    assert (status.Get_source(), status.Get_tag()) == (prv, 7)


def test_debug_mode_names_gradients_that_diverged(comm):
    # ChainerMN raises in debug mode when a mean gradient holds NaN; mnpar did not check.
    import chainer
    import chainer.links as L

    model = L.Linear(2, 3)
    model.W.grad = np.ones((3, 2), np.float32)
    model.b.grad = np.full(3, np.nan if comm.rank == 0 else 1, np.float32)
    comm.multi_node_mean_grad(model)  # not in debug mode: no check
    with chainer.using_config("debug", True):
        with pytest.raises(ValueError, match=r"gradients diverged after the allreduce: .*'/b'"):
            comm.multi_node_mean_grad(model)
        model.b.grad = np.ones(3, np.float32)
        comm.multi_node_mean_grad(model)
