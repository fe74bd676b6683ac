"""examples/spatial/train_denoise.py and train_gb.py, launched with ``mpiexec`` as a user would.

A few updates of a small U-Net on small crops, at one rank and on a 1x2 grid
of two ranks; each run has a hard timeout (its whole process group is killed
past it), so a deadlock fails the test instead of hanging the suite.
"""
import math
import os
import re

import numpy as np
import pytest
from PIL import Image
from test_examples_mlp import ROOT, finish, log_of, run, start

SCRIPT = os.path.join(ROOT, "examples", "spatial", "train_denoise.py")
UPDATES = 5
SHORT = ["--iteration", str(UPDATES), "--log-interval", "1", "--crop", "32", "--crops", "64",
         "--channels", "8", "--batchsize", "4", "--seed", "1"]


def denoise(out_dir, n, *args):
    """A short run; returns (stdout, the losses of its updates, its log)."""
    out = run(SHORT + ["--out", str(out_dir), *args], n=n, script=SCRIPT)
    log = log_of(out_dir)
    assert [entry["iteration"] for entry in log] == list(range(1, UPDATES + 1))
    return out, [entry["main/loss"] for entry in log], log


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("one-rank")
    return (out_dir, *denoise(out_dir, 1))


@pytest.mark.slow
def test_trains_at_one_rank_and_writes_the_log_plots_and_picture(one_rank):
    out_dir, out, losses, log = one_rank
    assert "U-Net denoising 32x32 crops over 1 rank: grid 1x1, 1 group, 64 crops" in out
    assert all(math.isfinite(x) for x in losses)
    # The net starts as the identity, so the first loss is the noise's variance (0.1 ** 2).
    assert losses[0] == pytest.approx(0.01, rel=0.05)
    assert sum(losses[-2:]) / 2 < 0.99 * losses[0]  # learning to tell the noise apart
    assert "validation/main/loss" in log[-1]  # validated after the last update
    assert all("validation/main/loss" not in entry for entry in log[:-1])
    assert math.isfinite(log[-1]["validation/main/psnr"])
    for name in ("loss.png", "psnr.png", "denoised.png"):
        assert (out_dir / name).stat().st_size > 0, name
    with Image.open(out_dir / "denoised.png") as picture:  # noisy | denoised | clean
        assert picture.size == (3 * 160, 424)
    noisy, denoised = re.search(r"validation image 1: noisy ([\d.]+) dB, denoised ([\d.]+) dB",
                                out).groups()
    assert float(noisy) == pytest.approx(20, abs=0.1)  # the noise's PSNR: -10 log10(0.1 ** 2)
    assert math.isfinite(float(denoised)) and "\033[J" not in out


@pytest.mark.slow
def test_a_1x2_grid_of_two_ranks_gives_the_one_rank_losses(one_rank, tmp_path):
    _, _, one, one_log = one_rank
    out, two, two_log = denoise(tmp_path, 2, "--grid", "1x2")
    assert "over 2 ranks: grid 1x2, 1 group" in out
    # Five updates: float32 rounding (1e-7 here) grows with training, 0.1 % after tens of them.
    assert two == pytest.approx(one, rel=1e-5)
    assert (two_log[-1]["validation/main/loss"]
            == pytest.approx(one_log[-1]["validation/main/loss"], rel=1e-5))
    with Image.open(tmp_path / "denoised.png") as picture:
        assert picture.size == (3 * 160, 424)


def test_a_grid_that_does_not_fit_the_ranks_is_one_message_and_a_failing_exit(tmp_path):
    code, out, err = finish(start(SHORT + ["--grid", "1x2", "--out", str(tmp_path)], n=1,
                                  script=SCRIPT))
    assert code == 2
    assert "Traceback" not in out + err
    assert ("error: train_denoise.py: the grid 1x2 needs a multiple of 2 ranks, but it runs "
            "on 1") in err
    assert not os.listdir(tmp_path)


LARGE = os.path.join(ROOT, "examples", "spatial", "large_images.py")


@pytest.mark.slow
def test_large_images_on_a_grid_are_exact_and_the_batched_one_process_reports_how_it_went():
    # The script docs/spatial.rst gives for images too large for chainer on one GPU,
    # small, on CPUs, with columns split unevenly (23 | 22).
    out = run(["--size", "45", "--batch", "2", "--channels", "4", "--layers", "3",
               "--batched"], n=2, script=LARGE)
    assert "3 x (conv 3x3 4->4, pad 1, ReLU) on 2 x 4 x 45 x 45 images, grid 1x2, @numpy" in out
    relative = float(re.search(r"weight gradients: largest difference \S+, (\S+) of the "
                               r"largest gradient", out)[1])
    assert relative < 1e-5
    assert "exact: the grid's gradients are one process's, to float32 rounding" in out
    assert re.search(r"one process, whole batch \(rank 0\): [\d.]+ s", out)


# -- examples/spatial/train_gb.py: neon's GB model -----------------------------------------

GB = os.path.join(ROOT, "examples", "spatial", "train_gb.py")
GB_SHORT = ["--float64", "--iteration", "3", "--pretrain", "1", "--epoch", "1", "--maps", "4"]


def gb(out_dir, n, *args):
    """A short float64 run; returns (stdout, its saved losses and accuracy)."""
    out = run(GB_SHORT + ["--out", str(out_dir), *args], n=n, script=GB)
    with np.load(out_dir / "losses.npz") as f:
        return out, {name: f[name] for name in f.files}


@pytest.fixture(scope="module")
def gb_one_rank(tmp_path_factory):
    return gb(tmp_path_factory.mktemp("gb-one-rank"), 1)


@pytest.mark.slow
def test_gb_pretrains_and_classifies_at_one_rank(gb_one_rank):
    out, saved = gb_one_rank
    assert "GB on 24x24 digits over 1 rank: grid 1x1, 4 maps, float64, @numpy" in out
    assert len(saved["pretrain"]) == len(saved["classify"]) == 3
    assert np.isfinite(saved["pretrain"]).all() and np.isfinite(saved["classify"]).all()
    assert saved["pretrain"][-1] < saved["pretrain"][0]  # the reconstruction improves
    assert re.search(r"validation accuracy 0\.\d{4} \(297 digits\)", out)


@pytest.mark.slow
@pytest.mark.parametrize("n, grid", [(2, "1x2"), (4, "2x2")])
def test_gb_on_a_grid_computes_what_one_process_computes(gb_one_rank, tmp_path, n, grid):
    _, one = gb_one_rank
    out, tiled = gb(tmp_path, n, "--grid", grid)
    assert f"over {n} ranks: grid {grid}" in out
    for name in ("pretrain", "classify"):
        np.testing.assert_allclose(tiled[name], one[name], rtol=1e-12, err_msg=name)
    assert float(tiled["accuracy"]) == float(one["accuracy"])


def test_a_gb_grid_that_leaves_ranks_out_is_one_message_and_a_failing_exit(tmp_path):
    code, out, err = finish(start(GB_SHORT + ["--grid", "1x2", "--out", str(tmp_path)], n=1,
                                  script=GB))
    assert code == 2 and "Traceback" not in out + err
    assert "error: train_gb.py: the grid 1x2 must use all 1 ranks" in err
