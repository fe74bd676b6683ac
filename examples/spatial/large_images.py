"""Images too large for chainer on one GPU, run exactly on a grid of ranks.

::

    mpiexec -n 2 python examples/spatial/large_images.py [--gpu] [--size 64] [--batch 2]
        [--channels 8] [--layers 4] [--batched]

The model is ``benchmarks/bench_spatial.py``'s: ``--layers`` 3x3
convolutions of ``--channels`` channels (pad 1, with bias), each followed by
a ReLU, on ``--batch`` random images of ``--size`` x ``--size``. Every rank
of a 1xN grid (N: the ranks) holds its columns of every image and runs one
forward and backward pass of the whole batch from a fixed output gradient
(``mnpar.spatial.Convolution2D``); each rank's weight gradients are then the
whole batch's. Rank 0 runs chainer's own stack in one process, one image at
a time with the gradients accumulated, and prints how far the grid's weight
gradients and rank 0's output tile are from those: the run is exact when
they agree to float32 rounding (the script then exits with 0, else 1).

``--batched`` adds, last, chainer's stack on the whole batch at once in one
process (rank 0), and says how that went. On a GPU with enough memory,
``--gpu --size 2048 --batch 4 --channels 32 --layers 4`` is the case
docs/spatial.rst reports: the 1x2 grid exact, chainer's batched one process
failing with ``cudaErrorIllegalAddress``, its convolution's im2col buffer
(N x C x 3 x 3 x H x W = 4.8e9 elements) past 2^31. It runs last because a
CUDA error of that kind leaves the process's GPU unusable. The defaults are
small enough for CPUs.
"""
import argparse
import os
import sys
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

import mnpar
import mnpar.spatial

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402  what the examples share (examples/common.py)

EXACT = 1e-4  # float32 rounding over a few layers stays far below this, relative


def stack(conv, layers):
    """``layers`` times ``conv()`` then ReLU."""
    parts = []
    for _ in range(layers):
        parts += [conv(), F.relu]
    return chainer.Sequential(*parts)


def sync(device):
    """Waits for the GPU's queued work (nothing on the CPU): before reading a clock."""
    if device.xp is not np:
        device.device.synchronize()


def step(model, x, gy, device):
    """One forward and backward from ``gy``; returns the output (on the host) and seconds."""
    sync(device)
    start = time.perf_counter()
    model.cleargrads()
    y = model(x)
    y.grad = gy
    y.backward()
    sync(device)
    return time.perf_counter() - start


def grads(model):
    """Every parameter gradient, on the host, by parameter name."""
    return {name: chainer.backend.CpuDevice().send(p.grad) for name, p in model.namedparams()}


def largest_difference(a, b):
    """The largest difference between two dicts of arrays, and that over the largest value."""
    diff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
    scale = max(float(np.max(np.abs(b[k]))) for k in b)
    return diff, diff / scale


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=64, help="image height and width")
    parser.add_argument("--batch", type=int, default=2, help="images (default 2)")
    parser.add_argument("--channels", type=int, default=8, help="channels (default 8)")
    parser.add_argument("--layers", type=int, default=4, help="convolutions (default 4)")
    parser.add_argument("--batched", action="store_true",
                        help="last, chainer's stack on the whole batch in one process (rank 0)")
    common.add_gpu_option(parser)
    args = parser.parse_args(argv)
    for name in ("size", "batch", "channels", "layers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    comm = mnpar.create_communicator("naive")
    device = common.device_of(comm, args.gpu)
    grid = mnpar.spatial.SpatialGrid(comm, (1, comm.size))
    n, c, size = args.batch, args.channels, args.size
    if comm.rank == 0:
        print(f"{args.layers} x (conv 3x3 {c}->{c}, pad 1, ReLU) on {n} x {c} x {size} x {size} "
              f"images, grid 1x{comm.size}, {device}", flush=True)
    rng = np.random.default_rng(0)  # the same images and output gradient on every rank
    x = rng.standard_normal((n, c, size, size), dtype=np.float32)
    gy = rng.standard_normal((n, c, size, size), dtype=np.float32)
    np.random.seed(1)
    single = stack(lambda: L.Convolution2D(c, c, 3, pad=1), args.layers)
    tiled = stack(lambda: mnpar.spatial.Convolution2D(c, c, 3, pad=1, grid=grid), args.layers)
    tiled.copyparams(single)
    tiled.to_device(device)

    with chainer.using_config("train", True):
        x_tile, gy_tile = device.send(grid.tile(x)), device.send(grid.tile(gy))
        seconds = step(tiled, x_tile, gy_tile, device)
        tile_out = chainer.backend.CpuDevice().send(tiled(x_tile).array)
    on_grid = grads(tiled)
    del x_tile, gy_tile
    exact = True
    if comm.rank == 0:
        print(f"grid 1x{comm.size}: forward and backward of the batch in {seconds:.2f} s")
        single.to_device(device)
        seconds, parts = 0.0, []
        accumulated = None
        for i in range(n):  # image by image: the largest buffer is one image's
            xi, gyi = device.send(x[i:i + 1]), device.send(gy[i:i + 1])
            seconds += step(single, xi, gyi, device)
            g = grads(single)
            accumulated = g if accumulated is None else {k: accumulated[k] + g[k] for k in g}
            parts.append(chainer.backend.CpuDevice().send(single(xi).array))
            del xi, gyi
        out = np.concatenate(parts)
        diff, relative = largest_difference(on_grid, accumulated)
        out_diff = float(np.max(np.abs(tile_out - grid.tile(out))))
        exact = relative < EXACT and out_diff < EXACT * float(np.max(np.abs(out)))
        print(f"one process, image by image (rank 0): {seconds:.2f} s")
        print(f"weight gradients: largest difference {diff:.2g}, {relative:.2g} of the largest "
              f"gradient; rank 0's output tile: largest difference {out_diff:.2g}")
        print("exact: the grid's gradients are one process's, to float32 rounding" if exact
              else "NOT exact: the grid's gradients differ from one process's")
        if args.batched:
            sys.stdout.flush()
            print(f"one process, whole batch (rank 0): {batched(single, x, gy, device)}",
                  flush=True)
    exact = comm.bcast_obj(exact)
    grid.free()
    comm.finalize()
    return 0 if exact else 1


def batched(model, x, gy, device):
    """chainer's stack on the whole batch at once: how it went, in words."""
    try:
        seconds = step(model, device.send(x), device.send(gy), device)
    except Exception as error:  # on a GPU: cupy's CUDA errors, out of memory
        return f"failed: {type(error).__name__}: {error}"
    return f"{seconds:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
