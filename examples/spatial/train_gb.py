"""neon's second distributed model, "GB": local filtering, L2 pooling and local contrast
normalization, twice, then a tower classifier, with every image cut into tiles across ranks.

::

    mpiexec -n 4 python examples/spatial/train_gb.py [--grid 2x2] [--maps 8]
        [--pretrain 1] [--epoch 2] [--batchsize 32] [--float64] [--gpu] [--out result/gb]

The "Google Brain" sparse autoencoder (Le et al., 2012) as neon distributed
it: locally connected layers with untied weights (each rank holds only the
filters of its own output pixels), L2 pooling (the square root of an
average pool of squares), local contrast normalization (a Gaussian-weighted
mean subtracted, then a division by the local standard deviation or, where
larger, its mean over the image), and a fully connected "tower" that sums
each rank's partial product instead of gathering the image. The data are
scikit-learn's bundled handwritten digits (1797 8x8 images, no download),
enlarged to 24 x 24.

The first layer is pretrained as a sparse autoencoder (``--pretrain``
epochs): its codes reconstruct the input through a second local layer, with
an L1 penalty on the pooled codes; then the whole model trains to classify
(``--epoch`` epochs). Written with plain chainer links and functions
(``L.LocalConvolution2D``, ``F.average_pooling_2d``, ``F.convolution_2d``,
``F.pad``, ``F.mean``, ``L.Linear``), made spatial by
``mnpar.spatial.convert``: for the same seed, any grid computes what one
process computes (``--float64``: to 1e-12). With ``--gpu`` each rank
computes its tiles on its GPU (``examples/common.py``: its own, or shared
round robin).
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

import mnpar

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402  what the examples share (examples/common.py)

SIZE = 24  # the digits' 8 x 8 enlarged three times
TRAIN = 1500  # the first 1500 digits train, the other 297 validate


# -- data -------------------------------------------------------------------------------


def digits(dtype):
    """scikit-learn's digits as ``(N, 1, 24, 24)`` images in [0, 1] and ``(N,)`` labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = np.kron(data.images, np.ones((3, 3))) / 16  # each pixel a 3 x 3 block
    return images[:, None].astype(dtype), data.target.astype(np.int32)


# -- model ------------------------------------------------------------------------------


def gaussian(channels, size=5, sigma=1.0, dtype=np.float32):
    """A ``(1, channels, size, size)`` Gaussian window summing to 1 over space and channels."""
    r = np.arange(size) - size // 2
    g = np.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / (2 * sigma ** 2))
    g = np.broadcast_to(g, (1, channels, size, size))
    return (g / g.sum()).astype(dtype)


def l2_pooling(h, ksize=3, stride=2, pad=1):
    """The square root of the average pool of squares (neon's L2 pooling)."""
    return F.sqrt(F.average_pooling_2d(h * h, ksize, stride, pad) + 1e-6)


def local_contrast_normalization(h, size=5):
    """Subtractive, then divisive normalization with a Gaussian window over every map.

    ``v = h - g * h``; ``y = v / max(s, mean(s))`` with ``s = sqrt(g * v²)``, the
    mean over each image (a reduction over the split axes: one allreduce on tiles).
    """
    channels = h.shape[1]
    xp = chainer.backend.get_array_module(h)
    window = xp.asarray(gaussian(channels, size, dtype=h.dtype))  # on h's device
    local_mean = F.convolution_2d(h, window, pad=size // 2)
    v = h - F.broadcast_to(local_mean, h.shape)
    s = F.sqrt(F.convolution_2d(v * v, window, pad=size // 2) + 1e-6)
    floor = F.broadcast_to(F.mean(s, axis=(1, 2, 3), keepdims=True), s.shape)
    return v / F.broadcast_to(F.maximum(s, floor), v.shape)


class Stage(chainer.Chain):
    """Local filtering (untied ``k x k`` filters per output pixel), L2 pooling, LCN."""

    def __init__(self, in_channels, maps, in_size, ksize):
        super().__init__()
        with self.init_scope():
            self.filters = L.LocalConvolution2D(in_channels, maps, in_size, ksize,
                                                initialW=chainer.initializers.Normal(0.3))

    def codes(self, x):
        return F.relu(self.filters(x))

    def forward(self, x):
        return local_contrast_normalization(l2_pooling(self.codes(x)))


class GB(chainer.Chain):
    """Two stages (24 -> 20 -> 10 and 10 -> 8 -> 4 pixels), then a tower classifier."""

    def __init__(self, maps=8):
        super().__init__()
        with self.init_scope():
            self.stage1 = Stage(1, maps, SIZE, 5)
            self.stage2 = Stage(maps, maps, 10, 3)
            self.classifier = L.Linear(maps * 4 * 4, 10)

    def forward(self, x):
        return self.classifier(self.stage2(self.stage1(x)))


class SparseAutoencoder(chainer.Chain):
    """Stage 1's codes reconstruct the input (a local layer over the padded codes); the loss
    is the reconstruction's mean squared error plus ``sparsity`` times the pooled codes' mean."""

    def __init__(self, stage, maps, sparsity=0.1):
        super().__init__()
        self.sparsity = sparsity
        with self.init_scope():
            self.stage = stage
            self.decoder = L.LocalConvolution2D(maps, 1, SIZE + 4, 5,
                                                initialW=chainer.initializers.Normal(0.05))

    def forward(self, x):
        codes = self.stage.codes(x)                                   # 20 x 20
        padded = F.pad(codes, ((0, 0), (0, 0), (4, 4), (4, 4)), "constant")   # 28 x 28
        error = F.mean(F.squared_difference(self.decoder(padded), x))
        loss = error + self.sparsity * F.mean(l2_pooling(codes))
        chainer.report({"loss": loss, "reconstruction": error}, self)
        return loss


# -- options and grid -------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", type=common.parse_grid, default=None, metavar="RxC",
                        help="ranks along height x width (default: 1x1, 1x2, 2x2 at 1, 2, 4 "
                             "ranks)")
    parser.add_argument("--maps", type=int, default=8, help="maps per stage (default 8)")
    parser.add_argument("--pretrain", type=int, default=1,
                        help="epochs of sparse-autoencoder pretraining of stage 1 (default 1)")
    parser.add_argument("--epoch", "-e", type=int, default=2,
                        help="epochs of classification (default 2)")
    parser.add_argument("--iteration", "-i", type=int, default=0,
                        help="stop each phase after this many updates (default 0: whole epochs)")
    parser.add_argument("--batchsize", "-b", type=int, default=32, help="default 32")
    parser.add_argument("--float64", action="store_true",
                        help="train in float64 (to compare grids with one process)")
    parser.add_argument("--seed", type=int, default=0, help="seeds weights and order")
    common.add_gpu_option(parser)
    parser.add_argument("--out", "-o", default=os.path.join("result", "gb"),
                        help="output directory (default %(default)s)")
    args = parser.parse_args(argv)
    for name in ("maps", "batchsize"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    for name in ("pretrain", "epoch", "iteration", "seed"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be 0 or more, not {getattr(args, name)}")
    return args


def make_grid(comm, shape):
    """The grid (all ranks, the squarest by default), or None where it does not fit."""
    if shape is None:
        rows = max(r for r in range(1, math.isqrt(comm.size) + 1) if comm.size % r == 0)
        shape = (rows, comm.size // rows)
    if shape[0] * shape[1] != comm.size or max(shape) > 4:
        if comm.rank == 0:
            print(f"error: train_gb.py: the grid {shape[0]}x{shape[1]} must use all "
                  f"{comm.size} ranks, at most 4 along a side (the last stage is 4 x 4)",
                  file=sys.stderr)
        return None
    return mnpar.spatial.SpatialGrid(comm, shape)


# -- training ---------------------------------------------------------------------------


def run_phase(name, model, data, grid, args, labelled, device):
    """Epochs (or ``--iteration`` updates) of Adam on ``model``; returns its losses."""
    epochs = args.pretrain if name == "pretrain" else args.epoch
    optimizer = chainer.optimizers.Adam(alpha=2e-3).setup(model)
    it = chainer.iterators.SerialIterator(
        data, args.batchsize,
        order_sampler=mnpar.extensions.ResumableShuffleOrderSampler(args.seed))
    losses = []
    while it.epoch < epochs and (not args.iteration or len(losses) < args.iteration):
        x, t = chainer.dataset.concat_examples(it.next(), device)
        loss = model(x, t) if labelled else model(x)
        model.cleargrads()
        loss.backward()
        optimizer.update()
        losses.append(float(loss.array))
        if grid.comm.rank == 0 and (it.is_new_epoch or len(losses) == args.iteration):
            print(f"{name} epoch {it.epoch}: update {len(losses)}, loss {losses[-1]:.6f}",
                  flush=True)
    return losses


def accuracy(model, data, grid, device, batch=100):
    """The classifier's accuracy on ``data`` (tiles), the same on every rank."""
    right = 0
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        for begin in range(0, len(data), batch):
            x, t = chainer.dataset.concat_examples(data[begin:begin + batch], device)
            right += int((model.predictor(x).array.argmax(axis=1) == t).sum())
    return right / len(data)


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    comm = mnpar.create_communicator("naive")
    grid = make_grid(comm, args.grid)
    if grid is None:
        comm.finalize()
        return 2
    device = common.device_of(comm, args.gpu)
    dtype = np.float64 if args.float64 else np.float32
    images, labels = digits(dtype)
    train = mnpar.spatial.TiledDataset(
        chainer.datasets.TupleDataset(images[:TRAIN], labels[:TRAIN]), grid)
    val = mnpar.spatial.TiledDataset(
        chainer.datasets.TupleDataset(images[TRAIN:], labels[TRAIN:]), grid)

    np.random.seed(args.seed)  # the same weights on every rank (checked at the first forward)
    with chainer.using_config("dtype", dtype):
        gb = GB(args.maps)
        autoencoder = SparseAutoencoder(gb.stage1, args.maps)
    mnpar.spatial.convert(autoencoder, grid)
    classifier = L.Classifier(mnpar.spatial.convert(gb, grid))
    autoencoder.to_device(device)  # holds stage 1 of gb, and its decoder
    classifier.to_device(device)
    if comm.rank == 0:
        rows, cols = grid.shape
        print(f"GB on {SIZE}x{SIZE} digits over {comm.size} rank"
              f"{'s' if comm.size > 1 else ''}: grid {rows}x{cols}, {args.maps} maps, "
              f"{np.dtype(dtype).name}, {device}", flush=True)
    with chainer.using_config("dtype", dtype):
        pretrain = run_phase("pretrain", autoencoder, train, grid, args, False, device)
        losses = run_phase("classify", classifier, train, grid, args, True, device)
    score = accuracy(classifier, val, grid, device)
    if comm.rank == 0:
        print(f"validation accuracy {score:.4f} ({len(val)} digits); "
              f"{time.perf_counter() - start:.1f} s")
        os.makedirs(args.out, exist_ok=True)
        np.savez(os.path.join(args.out, "losses.npz"), pretrain=np.array(pretrain),
                 classify=np.array(losses), accuracy=score)
        print(f"losses: {os.path.join(args.out, 'losses.npz')}")
    grid.free()
    comm.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
