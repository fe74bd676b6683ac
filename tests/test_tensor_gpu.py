"""Tensor parallelism on GPUs: the conjugate collectives on cupy arrays (host-staged, and
through NCCL with ``pure_nccl``), a split Transformer equal to one process on the same
GPU, and the example with ``--gpu``.

Marked ``gpu`` (skipped without cupy and a CUDA device: CI has none); the NCCL tests
``nccl`` too (one rank per device). The example's test runs in the one-process run
of the suite and launches its own ``mpiexec``.
"""
import json
import os

import chainer
import chainer.links as L
import pytest
from tensor_models import LM
from tensor_twins import build, close, part_of
from test_examples_mlp import ROOT, run
from test_tensor_parallelize import LM_SIZES, lm_plan, tokens

import mnpar

pytestmark = pytest.mark.gpu
M = mnpar.functions


@pytest.fixture
def cupy():
    import cupy

    return cupy


def use_device(comm, cp):
    device = comm.intra_rank % cp.cuda.runtime.getDeviceCount()
    cp.cuda.Device(device).use()
    return device


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["naive", pytest.param("pure_nccl", marks=pytest.mark.nccl)])
def test_the_conjugate_collectives_on_gpu_arrays(cupy, name):
    comm = mnpar.create_communicator(name, timeout=60)
    use_device(comm, cupy)
    x = chainer.Variable(cupy.arange(6 * comm.size, dtype=cupy.float64).reshape(3, -1) + 1)
    total = M.reduce_from_group(comm, M.copy_to_group(comm, x) * (comm.rank + 1))
    cupy.testing.assert_allclose(total.array, x.array * comm.size * (comm.size + 1) / 2)
    whole = M.gather_from_group(comm, M.scatter_to_group(comm, x, axis=1), axis=1)
    cupy.testing.assert_array_equal(whole.array, x.array)
    part = M.reduce_scatter_from_group(comm, M.gather_to_group(comm, x[:, :2], axis=1), axis=1)
    assert isinstance(part.array, cupy.ndarray)
    chainer.functions.sum(part * part + whole + total).backward()
    assert isinstance(x.grad, cupy.ndarray)
    comm.finalize()


@pytest.mark.mpi(min_size=1)
@pytest.mark.nccl
def test_a_split_transformer_on_gpus_equals_one_process_on_the_gpu(cupy):
    comm = mnpar.create_communicator("pure_nccl", timeout=60)
    device = chainer.get_device(f"@cupy:{use_device(comm, cupy)}")
    x, t = tokens()
    models = []
    for split in (False, True):
        model = build(lambda: L.Classifier(LM(**LM_SIZES)))
        if split:
            mnpar.tensor.parallelize(model, comm, lm_plan())
        model.to_device(device)
        loss = model(device.send(x), device.send(t))
        model.cleargrads()
        loss.backward()
        models.append((model, float(loss.array)))
    (ref, ref_loss), (ours, our_loss) = models
    close(our_loss, ref_loss, 1e-9, "loss")
    theirs = dict(ref.namedparams())
    for name, p in ours.namedparams():
        close(cupy.asnumpy(p.grad), part_of(p, cupy.asnumpy(theirs[name].grad)), 1e-9, name)
    comm.finalize()


def test_the_example_trains_on_gpus_as_on_cpus(tmp_path):
    script = os.path.join(ROOT, "examples", "tensor_parallel", "train_lm.py")
    args = ["--dtype", "float64", "--steps", "4", "--log-interval", "2", "--units", "24",
            "--heads", "6", "--layers", "1", "--length", "12", "--batchsize", "4"]
    logs = {}
    for device in ("cpu", "gpu"):
        out = run(args + ["--out", str(tmp_path / device)] + (["--gpu"] if device == "gpu"
                                                              else []), n=2, script=script)
        assert ("@cupy:" in out) == (device == "gpu") and ("pure_nccl" in out) == (
            device == "gpu")
        with open(tmp_path / device / "log.json") as f:
            logs[device] = [e["loss"] for e in json.load(f)["log"]]
    assert logs["gpu"] == pytest.approx(logs["cpu"], rel=1e-6)

