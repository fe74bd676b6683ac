"""Denoising photographs with a small U-Net whose images are cut into tiles across ranks.

::

    mpiexec -n 2 python examples/spatial/train_denoise.py [--grid 1x2] [--crop 64]
        [--epoch 3 | --iteration N] [--batchsize 8] [--noise 0.1] [--out result/spatial]
        [--gpu]

The data are the two photographs bundled with scikit-learn (427 x 640, no
download). Training examples are random crops of their left 480 columns
with Gaussian noise added, and the clean crop as the target; the validation
images are the held-out right strips (424 x 160) of both. The U-Net is
written with plain chainer links and ``F.max_pooling_2d``, then
``mnpar.spatial.convert`` makes it run on tiles: each rank holds one tile of
every activation, the layers exchange halos, batch normalization and the
loss cover the whole image, and every rank's parameters stay equal.

Every rank of the grid reads the same examples in the same order (one seed
for the crops, the noise and the iterator) and keeps its tiles
(``TiledDataset``). Rank 0 logs, prints and plots into ``--out``; at the end
every rank denoises the first validation image, ``gather`` assembles the
output, and rank 0 saves ``denoised.png`` (noisy | denoised | clean).

With ``--gpu`` each rank computes its tiles on its GPU (``examples/common.py``
picks it); halos, the batch-norm and weight-gradient sums and ``gather`` go
through host memory. ``large_images.py`` beside this script shows the case
spatial parallelism is for: images too large for chainer on one GPU.
"""
import argparse
import math
import os
import sys
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer.training import extensions

import mnpar

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402  what the examples share (examples/common.py)

DEPTH = 2  # poolings in the U-Net: crops must be multiples of 2 ** DEPTH
TRAIN_COLUMNS = 480  # crops come from columns [0, 480) of each photo
VALIDATION = (424, 160)  # the held-out strip: rows [0, 424), columns [480, 640)


# -- data -------------------------------------------------------------------------------


def photographs():
    """scikit-learn's two bundled photographs as float32 (3, 427, 640) arrays in [0, 1]."""
    from sklearn.datasets import load_sample_images

    return [np.ascontiguousarray(np.asarray(im, np.float32).transpose(2, 0, 1) / 255)
            for im in load_sample_images().images]


def add_noise(clean, sigma, seed):
    """``clean`` plus Gaussian noise drawn from ``seed`` (a tuple of ints)."""
    noise = np.random.RandomState(seed).standard_normal(clean.shape).astype(np.float32)
    return clean + sigma * noise


class NoisyCrops(chainer.dataset.DatasetMixin):
    """``n`` random crops of the photographs: ``(noisy, clean)`` pairs, ``(3, crop, crop)``.

    The crops' places and each one's noise follow from ``seed`` and the
    example's index alone, so every rank builds the same examples.
    """

    def __init__(self, photos, n, crop, sigma, seed):
        rng = np.random.RandomState(seed)
        self.photos, self.crop, self.sigma, self.seed = photos, crop, sigma, seed
        self.places = [(k, rng.randint(photos[k].shape[1] - crop + 1),
                        rng.randint(TRAIN_COLUMNS - crop + 1))
                       for k in rng.randint(len(photos), size=n)]

    def __len__(self):
        return len(self.places)

    def get_example(self, i):
        k, y, x = self.places[i]
        clean = self.photos[k][:, y:y + self.crop, x:x + self.crop]
        if (i + self.seed) % 2:
            clean = clean[:, :, ::-1]  # half the crops mirrored
        clean = np.ascontiguousarray(clean)
        return add_noise(clean, self.sigma, (self.seed, i)), clean


def validation_images(photos, sigma, seed):
    """The held-out strips of both photographs, noisy and clean: two (2, 3, 424, 160) arrays."""
    rows, cols = VALIDATION
    clean = np.stack([p[:, :rows, TRAIN_COLUMNS:TRAIN_COLUMNS + cols] for p in photos])
    return add_noise(clean, sigma, (seed, 1 << 30)), clean


# -- model ------------------------------------------------------------------------------


class ConvBlock(chainer.Chain):
    """Two 3x3 convolutions, each followed by batch normalization and ReLU."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(in_channels, out_channels, 3, pad=1, nobias=True)
            self.n1 = L.BatchNormalization(out_channels)
            self.c2 = L.Convolution2D(out_channels, out_channels, 3, pad=1, nobias=True)
            self.n2 = L.BatchNormalization(out_channels)

    def forward(self, x):
        return F.relu(self.n2(self.c2(F.relu(self.n1(self.c1(x))))))


class UNet(chainer.Chain):
    """A two-level U-Net that estimates the noise; it returns the input minus that estimate.

    ::

        x -> enc1 ------------------------------ concat -> dec1 -> out -> x - out
               \\ pool -> enc2 -------- concat -> dec2 -> up1 /
                          \\ pool -> mid -> up2 /
    """

    def __init__(self, channels=16):
        super().__init__()
        c = channels
        with self.init_scope():
            self.enc1 = ConvBlock(3, c)
            self.enc2 = ConvBlock(c, 2 * c)
            self.mid = ConvBlock(2 * c, 4 * c)
            self.up2 = L.Deconvolution2D(4 * c, 2 * c, 2, stride=2)
            self.dec2 = ConvBlock(4 * c, 2 * c)
            self.up1 = L.Deconvolution2D(2 * c, c, 2, stride=2)
            self.dec1 = ConvBlock(2 * c, c)
            self.out = L.Convolution2D(c, 3, 1, initialW=0)  # starts as the identity

    def forward(self, x):
        h1 = self.enc1(x)
        h2 = self.enc2(F.max_pooling_2d(h1, 2))
        h = self.mid(F.max_pooling_2d(h2, 2))
        h = self.dec2(F.concat((self.up2(h), h2)))
        h = self.dec1(F.concat((self.up1(h), h1)))
        return x - self.out(h)


class Denoiser(chainer.Chain):
    """The loss: the whole images' mean squared error, and the PSNR it means (pixels in [0, 1])."""

    def __init__(self, unet, grid):
        super().__init__()
        with self.init_scope():
            self.unet = unet
        self.grid = grid

    def forward(self, noisy, clean):
        loss = mnpar.spatial.mean_squared_error(self.unet(noisy), clean, self.grid)
        chainer.report({"loss": loss, "psnr": psnr(float(loss.array))}, self)
        return loss


def psnr(mse):
    """Peak signal-to-noise ratio in dB of images in [0, 1]."""
    return -10 * math.log10(max(mse, 1e-12))


# -- options ----------------------------------------------------------------------------


def default_grid(n):
    """The squarest grid of ``n`` ranks, the wider side last: 1x1, 1x2, 2x2, 2x3..."""
    rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
    return rows, n // rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", type=common.parse_grid, default=None, metavar="RxC",
                        help="ranks along height x width (default: 1x1, 1x2, 2x2 at 1, 2, 4 "
                             "ranks); fewer than the ranks: data-parallel groups of grids")
    parser.add_argument("--crop", type=int, default=64,
                        help=f"training crops' side, a multiple of {2 ** DEPTH} (default 64)")
    parser.add_argument("--crops", type=int, default=512,
                        help="training crops in an epoch (default 512)")
    parser.add_argument("--noise", type=float, default=0.1,
                        help="noise standard deviation, pixels in [0, 1] (default 0.1)")
    parser.add_argument("--channels", type=int, default=16,
                        help="channels at the first level (default 16)")
    parser.add_argument("--epoch", "-e", type=int, default=3, help="epochs (default 3)")
    parser.add_argument("--iteration", "-i", type=int, default=0,
                        help="stop after this many updates instead (default 0: use --epoch)")
    parser.add_argument("--log-interval", type=int, default=0, metavar="N",
                        help="log, validate and plot every N updates (default: every epoch, "
                             "or at the end with --iteration)")
    parser.add_argument("--batchsize", "-b", type=int, default=8,
                        help="crops per update (per group of grids) (default 8)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds weights, crops, noise and order (default 0)")
    parser.add_argument("--out", "-o", default=os.path.join("result", "spatial"),
                        help="output directory (default %(default)s)")
    common.add_gpu_option(parser)
    args = parser.parse_args(argv)
    for name in ("crop", "crops", "channels", "epoch", "batchsize"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    for name in ("iteration", "log_interval", "seed"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be 0 or more, not "
                         f"{getattr(args, name)}")
    if args.crop % 2 ** DEPTH or args.crop > min(TRAIN_COLUMNS, 427):
        parser.error(f"--crop {args.crop} must be a multiple of {2 ** DEPTH} and at most 424")
    if args.noise < 0:
        parser.error(f"--noise must be 0 or more, not {args.noise}")
    return args


def make_grid(comm, shape, crop):
    """The SpatialGrid, or None (rank 0 says why) when it does not fit the ranks or crops."""
    shape = shape or default_grid(comm.size)
    problem = None
    if comm.size % (shape[0] * shape[1]):
        problem = (f"the grid {shape[0]}x{shape[1]} needs a multiple of {shape[0] * shape[1]} "
                   f"ranks, but it runs on {comm.size}")
    elif crop // 2 ** DEPTH < max(shape):
        problem = (f"--crop {crop} is too small for the grid {shape[0]}x{shape[1]}: the "
                   f"smallest activation ({crop // 2 ** DEPTH} rows) needs a row per rank; "
                   f"use --crop {2 ** DEPTH * max(shape)} or more")
    if problem:
        if comm.rank == 0:
            print(f"error: train_denoise.py: {problem}", file=sys.stderr)
        return None
    return mnpar.spatial.SpatialGrid(comm, shape)


# -- training ---------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    comm = mnpar.create_communicator("naive")
    grid = make_grid(comm, args.grid, args.crop)
    if grid is None:
        comm.finalize()
        return 2
    device = common.device_of(comm, args.gpu)
    common.reseed(args.seed, args.gpu)

    photos = photographs()
    train = NoisyCrops(photos, args.crops, args.crop, args.noise, args.seed)
    if grid.groups > 1:  # data parallel across groups: each group its share of the crops
        begin, end = mnpar.scatter_index(len(train), grid.sample_comm)
        train = chainer.datasets.SubDataset(train, begin, end)
    val_noisy, val_clean = validation_images(photos, args.noise, args.seed)
    train = mnpar.spatial.TiledDataset(train, grid, image=(0, 1))
    val = mnpar.spatial.TiledDataset(
        chainer.datasets.TupleDataset(val_noisy, val_clean), grid, image=(0, 1))

    unet = mnpar.spatial.convert(UNet(args.channels), grid)
    model = Denoiser(unet, grid)
    comm.bcast_data(model)  # the same initial weights everywhere
    model.to_device(device)
    optimizer = chainer.optimizers.Adam(alpha=2e-3)
    if grid.groups > 1:
        optimizer = mnpar.create_multi_node_optimizer(optimizer, grid.sample_comm)
    optimizer.setup(model)

    # One order for every rank of a grid: the tiles of one update come from the same crops.
    train_iter = chainer.iterators.SerialIterator(
        train, args.batchsize,
        order_sampler=mnpar.extensions.ResumableShuffleOrderSampler(args.seed))
    val_iter = chainer.iterators.SerialIterator(val, len(val), repeat=False, shuffle=False)
    updater = chainer.training.StandardUpdater(train_iter, optimizer, device=device)
    stop = (args.iteration, "iteration") if args.iteration else (args.epoch, "epoch")
    every = ((args.log_interval, "iteration") if args.log_interval
             else stop if args.iteration else (1, "epoch"))
    trainer = chainer.training.Trainer(updater, stop, out=args.out)
    # Every rank validates (the layers exchange halos), after each epoch and the last update.
    last = args.iteration or None
    trainer.extend(extensions.Evaluator(val_iter, model, device=device),
                   trigger=lambda t: t.updater.is_new_epoch or t.updater.iteration == last)
    plots = add_reporting(trainer, every) if comm.rank == 0 else []
    if comm.rank == 0:
        rows, cols = grid.shape
        print(f"U-Net denoising {args.crop}x{args.crop} crops over {comm.size} "
              f"rank{'s' if comm.size > 1 else ''}: grid "
              f"{rows}x{cols}, {grid.groups} group{'s' if grid.groups > 1 else ''}, "
              f"{len(train)} crops a group, {device}", flush=True)
    trainer.run()

    picture = os.path.join(args.out, "denoised.png")
    before, after = denoise(unet, grid, device, val_noisy[:1], val_clean[:1], picture)
    if comm.rank == 0:
        seconds = time.perf_counter() - start
        print(f"validation image 1: noisy {before:.2f} dB, denoised {after:.2f} dB PSNR; "
              f"{seconds:.1f} s")
        print(f"log:     {os.path.join(args.out, 'log')}")
        for name in plots + ["denoised.png"]:
            print(f"picture: {os.path.join(args.out, name)}")
    grid.free()
    comm.finalize()
    return 0


def add_reporting(trainer, every):
    """Rank 0's log, printout and plots; returns the plots' file names."""
    trainer.extend(extensions.LogReport(trigger=every))
    tty = sys.stdout.isatty()
    trainer.extend(extensions.PrintReport(
        ["epoch", "iteration", "main/loss", "main/psnr", "validation/main/loss",
         "validation/main/psnr", "elapsed_time"],
        out=sys.stdout if tty else common.PlainText(sys.stdout)))
    if tty:
        trainer.extend(extensions.ProgressBar(update_interval=1))
    if not extensions.PlotReport.available():
        print("matplotlib is missing: no plots (pip install matplotlib)")
        return []
    import matplotlib

    matplotlib.use("Agg")
    plots = {"loss.png": ["main/loss", "validation/main/loss"],
             "psnr.png": ["main/psnr", "validation/main/psnr"]}
    for name, keys in plots.items():
        trainer.extend(extensions.PlotReport(keys, x_key="iteration", trigger=every,
                                             filename=name))
    return list(plots)


def denoise(unet, grid, device, noisy, clean, path):
    """Denoises a whole image on the grid; rank 0 saves noisy | denoised | clean to ``path``.

    Returns the PSNR of the noisy and of the denoised image (collective).
    """
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        out = mnpar.spatial.gather(unet(device.send(grid.tile(noisy))), grid).array
    out = chainer.backend.CpuDevice().send(out)
    before = psnr(float(np.mean((noisy - clean) ** 2)))
    after = psnr(float(np.mean((np.clip(out, 0, 1) - clean) ** 2)))
    if grid.comm.rank == 0:
        from PIL import Image  # scikit-learn's sample images need Pillow already

        panels = np.concatenate([noisy[0], out[0], clean[0]], axis=2)  # side by side
        pixels = (np.clip(panels, 0, 1).transpose(1, 2, 0) * 255 + 0.5).astype(np.uint8)
        Image.fromarray(pixels).save(path)
    return before, after


if __name__ == "__main__":
    sys.exit(main())
