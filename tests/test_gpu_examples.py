"""Every example with ``--gpu``, and the single-GPU benchmarks, launched as a user would.

Marked ``gpu``: skipped without cupy and a CUDA device (CI has none). Unlike
tests/test_gpu.py, whose tests run on every rank under ``mpiexec``, each test
here runs once, in the one-process run of the suite, and launches its own
``mpiexec`` (2 ranks, 4 for dual_parallel) with a hard timeout; the ranks
share the GPUs round robin where they outnumber them. Where the CPU run is
cheap, the GPU run's losses are compared with it.
"""
import json
import os
import re

import numpy as np
import pytest
from test_examples_mlp import ROOT, run

pytestmark = pytest.mark.gpu


def example(path):
    return os.path.join(ROOT, "examples", path)


def log(out_dir):
    with open(os.path.join(out_dir, "log")) as f:
        return json.load(f)


def test_mlp_trains_on_gpus(tmp_path):
    out = run(["--gpu", "--epoch", "2", "--out", str(tmp_path)])
    assert "@cupy:" in out and "validation accuracy" in out


def test_seq2seq_trains_on_gpus(tmp_path):
    out = run(["--gpu", "--epoch", "1", "--out", str(tmp_path)],
              script=example("seq2seq/train_seq2seq.py"))
    assert "@cupy:" in out


def on_cpus_and_gpus(script, args, out_dir, n=2):
    """Runs ``script`` with ``args`` on CPUs, then with ``--gpu``, each into its own
    folder of ``out_dir`` (returned by device), and checks which one ran on cupy."""
    dirs = {}
    for device in ("cpu", "gpu"):
        dirs[device] = out_dir / device
        out = run(args + ["--out", str(dirs[device])] + (["--gpu"] if device == "gpu" else []),
                  n=n, script=example(script))
        assert ("@cupy:" in out) == (device == "gpu")
    return dirs


def assert_same_losses(dirs):
    """The GPU run's logged losses are the CPU run's, to 1%."""
    losses = {device: [entry["main/loss"] for entry in log(d)] for device, d in dirs.items()}
    assert losses["gpu"] == pytest.approx(losses["cpu"], rel=1e-2)


@pytest.mark.parametrize("script, n", [("data_parallel/train_mlp.py", 2),
                                       ("dual_parallel/train_dual.py", 4)])
def test_data_parallel_examples_train_on_gpus_as_on_cpus(tmp_path, script, n):
    assert_same_losses(on_cpus_and_gpus(script, ["--epochs", "2"], tmp_path, n))


def test_pipeline_trains_on_gpus_as_on_cpus(tmp_path):
    args = ["--epochs", "2", "--units", "64", "--balance", "8,7", "--schedule", "zb1"]
    assert_same_losses(on_cpus_and_gpus("pipeline/train_pipeline.py", args, tmp_path))


def test_spatial_denoising_trains_on_gpus_as_on_cpus(tmp_path):
    args = ["--iteration", "3", "--log-interval", "1", "--crop", "32", "--crops", "16",
            "--channels", "8", "--batchsize", "4", "--grid", "1x2"]
    assert_same_losses(on_cpus_and_gpus("spatial/train_denoise.py", args, tmp_path))


def test_large_images_are_exact_on_gpus():
    out = run(["--gpu", "--size", "256", "--batch", "2", "--channels", "16", "--batched"],
              script=example("spatial/large_images.py"))
    assert "grid 1x2, @cupy:" in out
    assert "exact: the grid's gradients are one process's" in out
    assert re.search(r"one process, whole batch \(rank 0\): [\d.]+ s", out)


@pytest.mark.parametrize("script, args", [
    ("bench_spatial.py", ["--size", "128", "--channels", "8", "--layers", "2", "--rounds", "1"]),
    ("bench_pipeline.py", ["--iters", "1", "--rounds", "1"]),
])
def test_the_one_gpu_benchmarks_run_on_a_gpu(script, args):
    out = run(["--gpu", *args], script=os.path.join(ROOT, "benchmarks", script))
    assert "@cupy:" in out


def test_gb_on_gpus_computes_what_it_computes_on_cpus(tmp_path):
    """neon's GB model on a 1x2 grid in float64: the GPU run's losses are the CPU run's."""
    args = ["--float64", "--iteration", "3", "--pretrain", "1", "--epoch", "1", "--maps", "4",
            "--grid", "1x2"]
    saved = {}
    for device, out_dir in on_cpus_and_gpus("spatial/train_gb.py", args, tmp_path).items():
        with np.load(out_dir / "losses.npz") as f:
            saved[device] = {name: f[name] for name in f.files}
    for name in ("pretrain", "classify"):
        np.testing.assert_allclose(saved["gpu"][name], saved["cpu"][name], rtol=1e-9,
                                   err_msg=name)
