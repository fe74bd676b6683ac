"""Sharded data parallelism on GPUs: NCCL's reduceScatter and allGather.

Marked ``gpu`` and ``nccl`` (one GPU per rank): CI, without a GPU, skips
them; a GPU machine runs them. Every stage on cupy arrays against plain data
parallelism over ``pure_nccl`` (float64, 1e-12; bit for bit at two ranks), the
checkpoint of a GPU model loaded on the CPU and back, and stage 3's gathers
freed between updates.
"""
import os
import shutil
import tempfile

import chainer
import numpy as np
import pytest
from sharded_models import OPTIMIZERS, Net, local, shards

import mnpar
from mnpar.optimizer_hooks import GradientClipping

pytestmark = [pytest.mark.gpu, pytest.mark.nccl, pytest.mark.mpi(min_size=1)]


@pytest.fixture(scope="module")
def comm():
    import cupy

    c = mnpar.create_communicator("pure_nccl", timeout=60)
    cupy.cuda.Device(c.intra_rank % cupy.cuda.runtime.getDeviceCount()).use()
    yield c
    c.finalize()


def gpu_train(comm, stage, steps=3, clip=False):
    import cupy

    model = Net()
    model.to_device(cupy.cuda.Device())
    opt = mnpar.create_multi_node_optimizer(OPTIMIZERS["Adam"](), comm, stage=stage)
    opt.setup(model)
    opt.add_hook(chainer.optimizer_hooks.WeightDecay(1e-2))
    if clip:
        opt.add_hook(GradientClipping(comm, 0.05, replicated=[(comm, model)]))
    for step in range(steps):
        x, t = local(comm, step)
        opt.update(model, cupy.asarray(x), cupy.asarray(t))
    return model, opt


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_stage_on_gpus_equals_plain_data_parallelism(comm, stage, clip):
    import cupy

    ref, _ = gpu_train(comm, 0, clip=clip)
    model, opt = gpu_train(comm, stage, clip=clip)
    whole = {n: cupy.asnumpy(p.array) for n, p in ref.namedparams()}
    for name, (start, stop, shard) in shards(opt).items():
        assert isinstance(shard, cupy.ndarray)
        got, want = cupy.asnumpy(shard), whole[name].reshape(-1)[start:stop]
        if comm.size <= 2 and not clip:
            assert np.array_equal(got, want), name
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=name)
    if stage == 3:
        assert all(p.array is None for p in model.params())
        assert opt._gather.gathered_bytes == 0


@pytest.mark.parametrize("stage", [2, 3])
def test_gpu_checkpoint_loads_on_the_cpu(comm, stage):
    _, opt = gpu_train(comm, stage, steps=2)
    root = comm.bcast_obj(tempfile.mkdtemp() if comm.rank == 0 else None)
    try:
        path = os.path.join(root, "gpu")
        mnpar.checkpoint.save(path, comm, opt)
        own = comm.split(comm.rank, 0)
        try:
            cpu = Net(seed=3)
            cpu_opt = mnpar.create_multi_node_optimizer(OPTIMIZERS["Adam"](), own, stage=1)
            mnpar.checkpoint.load(path, own, cpu_opt.setup(cpu))
        finally:
            own.finalize()
        import cupy

        for name, (start, stop, shard) in shards(opt).items():
            want = dict(cpu.namedparams())[name].array.reshape(-1)[start:stop]
            assert np.array_equal(cupy.asnumpy(shard), want), name
    finally:
        comm.allgather_obj(None)
        if comm.rank == 0:
            shutil.rmtree(root, ignore_errors=True)
