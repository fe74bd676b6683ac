"""Spatial links equal chainer's own link run in one process on the whole image.

Each spatial link is built with the same seed as chainer's link, so both
start from the same parameters. The spatial one runs on this rank's tile
of the image, chainer's on the whole image; the loss is ``sum(y * w)`` with
the same random ``w`` (tiled for the spatial link). Outputs and input
gradients must be this rank's tile of chainer's, parameter gradients the
whole image's, on every rank. Images are 31x29, so the tiles are uneven.
"""
import copy

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=1)

# dtype, tolerance
DTYPES = [pytest.param(np.float64, 1e-12, id="float64"),
          pytest.param(np.float32, 1e-5, id="float32")]


def on(shape, ranks):
    """A grid shape as a parameter, for ``ranks`` ranks or more."""
    return pytest.param(shape, id="x".join(map(str, shape)), marks=pytest.mark.mpi(min_size=ranks))


GRIDS_2D = [on((1, 1), 1), on((1, 2), 2), on((2, 1), 2), on((1, 3), 3), on((3, 1), 3),
            on((2, 2), 4)]
GRIDS_3D = [on((1, 1, 1), 1), on((1, 1, 2), 2), on((2, 1, 1), 2), on((2, 1, 2), 4)]
IMAGE = (2, 3, 31, 29)      # N, C, H, W
VOLUME = (2, 2, 7, 6, 9)    # N, C, D, H, W


def close(actual, expected, tol, what=""):
    """Equal within ``tol`` of the largest entry: a gradient summed over the image in float32
    is that far from chainer's, whose own summation order differs."""
    assert actual is not None, what
    expected = np.asarray(expected, np.float64)
    scale = max(1.0, float(np.abs(expected).max(initial=0)))
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=tol,
                               atol=tol * scale, err_msg=what)


def data(shape, dtype, seed, mean=0.0, std=1.0):
    return (np.random.RandomState(seed).standard_normal(shape) * std + mean).astype(dtype)


def built(make, dtype, seed=0):
    """``make()`` with the global seed and default dtype that chainer's initializers read."""
    np.random.seed(seed)
    with chainer.using_config("dtype", dtype):
        return make()


def forward_backward(link, x, w, **kwargs):
    """``sum(link(x) * w)`` forward and backward (``w`` made from ``y``'s shape if callable)."""
    link.cleargrads()
    x = chainer.Variable(x)
    np.random.seed(7)  # lazy initialization draws here: the same for both links
    with chainer.using_config("dtype", x.dtype):
        y = link(x, **kwargs)
    w = w(y.shape) if callable(w) else w
    F.sum(y * w).backward()
    return y.array, x.grad, w


def assert_transparent(grid, ref, ours, x, tol, **kwargs):
    """One forward and backward of ``ours`` on this rank's tile equals ``ref`` on the image."""
    y_ref, gx_ref, w = forward_backward(ref, x, lambda s: data(s, x.dtype, 1), **kwargs)
    y, gx, _ = forward_backward(ours, grid.tile(x), grid.tile(w), **kwargs)
    assert y.dtype == x.dtype and gx.dtype == x.dtype
    close(y, grid.tile(y_ref), tol, "y")
    close(gx, grid.tile(gx_ref), tol, "gx")
    theirs = dict(ref.namedparams())
    mine = dict(ours.namedparams())
    assert sorted(mine) == sorted(theirs)
    for name, p in theirs.items():
        close(mine[name].array, p.array, tol, f"{name} (value)")
        close(mine[name].grad, p.grad, tol, f"{name} (gradient)")


# -- convolution and deconvolution ---------------------------------------------------


CONV_2D = {
    "3x3-pad1": dict(in_channels=3, out_channels=4, ksize=3, pad=1),
    "3x3-valid": dict(in_channels=3, out_channels=2, ksize=3),
    "4x4-stride2-pad1": dict(in_channels=3, out_channels=4, ksize=4, stride=2, pad=1),
    "5x3-stride2-pad(2,0)": dict(in_channels=3, out_channels=2, ksize=(5, 3), stride=2,
                                 pad=(2, 0)),
    "3x3-stride(1,3)": dict(in_channels=3, out_channels=2, ksize=3, stride=(1, 3), pad=1),
    "3x3-dilate2": dict(in_channels=3, out_channels=2, ksize=3, pad=2, dilate=2),
    "1x1-nobias": dict(in_channels=3, out_channels=5, ksize=1, nobias=True),
    "3x3-groups3": dict(in_channels=3, out_channels=6, ksize=3, pad=1, groups=3),
}
DECONV_2D = {
    "3x3-pad1": dict(in_channels=3, out_channels=4, ksize=3, pad=1),
    "4x4-stride2-pad1": dict(in_channels=3, out_channels=2, ksize=4, stride=2, pad=1),
    "3x3-stride2-outsize": dict(in_channels=3, out_channels=2, ksize=3, stride=2,
                                outsize=(2 * 30 + 3 + 1, 2 * 28 + 3 + 1)),
    "3x3-stride(2,1)-pad(1,0)": dict(in_channels=3, out_channels=2, ksize=3, stride=(2, 1),
                                     pad=(1, 0)),
    "3x3-dilate2-pad2": dict(in_channels=3, out_channels=2, ksize=3, pad=2, dilate=2),
    "2x2-stride2-nobias": dict(in_channels=3, out_channels=2, ksize=2, stride=2, nobias=True),
    "3x3-groups3": dict(in_channels=3, out_channels=3, ksize=3, pad=1, groups=3),
}
BIAS = chainer.initializers.Normal(0.5)  # a bias that is not zero, drawn after W


def cases(configs, float32):
    """Every configuration in float64, and those named in ``float32`` in float32 too."""
    return ([pytest.param(args, np.float64, 1e-12, id=f"{name}-float64")
             for name, args in configs.items()]
            + [pytest.param(configs[name], np.float32, 1e-5, id=f"{name}-float32")
               for name in float32])


def with_bias(args):
    return args if args.get("nobias") else dict(args, initial_bias=BIAS)


@pytest.mark.parametrize("shape", GRIDS_2D)
@pytest.mark.parametrize("args, dtype, tol", cases(CONV_2D, ["3x3-pad1", "4x4-stride2-pad1"]))
def test_convolution_2d_equals_one_process(grid, dtype, tol, args):
    args = with_bias(args)
    ref = built(lambda: L.Convolution2D(**args), dtype)
    ours = built(lambda: S.Convolution2D(**args, grid=grid), dtype)
    assert isinstance(ours, L.Convolution2D)
    assert_transparent(grid, ref, ours, data(IMAGE, dtype, 2), tol)


@pytest.mark.parametrize("shape", GRIDS_2D)
@pytest.mark.parametrize("args, dtype, tol", cases(DECONV_2D, ["3x3-pad1", "4x4-stride2-pad1"]))
def test_deconvolution_2d_equals_one_process(grid, dtype, tol, args):
    args = with_bias(args)
    ref = built(lambda: L.Deconvolution2D(**args), dtype)
    ours = built(lambda: S.Deconvolution2D(**args, grid=grid), dtype)
    assert isinstance(ours, L.Deconvolution2D)
    assert_transparent(grid, ref, ours, data(IMAGE, dtype, 3), tol)


CONV_3D = {
    "3-pad1": dict(ksize=3, pad=1),
    "(3,2,3)-stride2-pad(1,0,1)": dict(ksize=(3, 2, 3), stride=2, pad=(1, 0, 1)),
    "3-dilate2-pad2": dict(ksize=3, pad=2, dilate=2),
    "3-stride2-cover_all": dict(ksize=3, stride=2, cover_all=True),
}
DECONV_3D = {
    "3-pad1": dict(ksize=3, pad=1),
    "3-stride2-pad1": dict(ksize=3, stride=2, pad=1),
    "2-stride2": dict(ksize=2, stride=2),
}


@pytest.mark.parametrize("shape", GRIDS_3D)
@pytest.mark.parametrize("args, dtype, tol", cases(CONV_3D, ["3-pad1"]))
def test_convolution_nd_of_volumes_equals_one_process(grid, dtype, tol, args):
    ref = built(lambda: L.ConvolutionND(3, 2, 3, initial_bias=BIAS, **args), dtype)
    ours = built(lambda: S.ConvolutionND(3, 2, 3, initial_bias=BIAS, **args, grid=grid),
                 dtype)
    assert_transparent(grid, ref, ours, data(VOLUME, dtype, 4), tol)


@pytest.mark.parametrize("shape", GRIDS_3D)
@pytest.mark.parametrize("args, dtype, tol", cases(DECONV_3D, ["3-stride2-pad1"]))
def test_deconvolution_nd_of_volumes_equals_one_process(grid, dtype, tol, args):
    ref = built(lambda: L.DeconvolutionND(3, 2, 3, initial_bias=BIAS, **args), dtype)
    ours = built(lambda: S.DeconvolutionND(3, 2, 3, initial_bias=BIAS, **args, grid=grid),
                 dtype)
    assert_transparent(grid, ref, ours, data(VOLUME, dtype, 5), tol)


LAZY = {  # chainer's class, the spatial one, arguments, image
    "Convolution2D": (L.Convolution2D, S.Convolution2D, (None, 4, 3), dict(pad=1), IMAGE),
    "Convolution2D(out, ksize)": (L.Convolution2D, S.Convolution2D, (4, 3), dict(stride=2),
                                  IMAGE),
    "Deconvolution2D": (L.Deconvolution2D, S.Deconvolution2D, (None, 2, 4),
                        dict(stride=2, pad=1), IMAGE),
    "ConvolutionND": (L.ConvolutionND, S.ConvolutionND, (3, None, 2, 3), dict(pad=1), VOLUME),
    "DeconvolutionND": (L.DeconvolutionND, S.DeconvolutionND, (3, None, 2, 2), dict(stride=2),
                        VOLUME),
}


@pytest.mark.parametrize("shape", [on((1, 1), 1), on((1, 2), 2), on((2, 2), 4)])
@pytest.mark.parametrize("chainer_cls, cls, args, kwargs, image", list(LAZY.values()),
                         ids=list(LAZY))
def test_lazy_initialization_draws_the_same_weights(grid, shape, chainer_cls, cls, args,
                                                    kwargs, image):
    ref = built(lambda: chainer_cls(*args, **kwargs), np.float64)
    ours = built(lambda: cls(*args, **kwargs, grid=grid), np.float64)
    assert ours.W.array is None
    assert_transparent(grid, ref, ours, data(image, np.float64, 6), 1e-12)
    assert ours.W.shape == ref.W.shape


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("overlap", [True, False])
def test_a_halo_moved_in_chunks_beside_the_interior_equals_one_process(grids, overlap):
    # A halo above _window_op.CHUNK_BYTES: the interior is computed in chunks
    # while MPI moves it (overlap=True), or after it (overlap=False).
    grid = grids((2, 1))
    args = dict(in_channels=8, out_channels=4, ksize=5, pad=2, initial_bias=BIAS)
    ref = built(lambda: L.Convolution2D(**args), np.float64)
    ours = built(lambda: S.Convolution2D(**args, grid=grid, overlap=overlap), np.float64)
    assert ours.overlap is overlap
    assert_transparent(grid, ref, ours, data((4, 8, 33, 160), np.float64, 8), 1e-12)


# -- batch normalization ----------------------------------------------------------------


def bn_pair(grid, dtype, size=3, **kwargs):
    """chainer's BatchNormalization and the spatial one, with the same random gamma and beta."""
    ref = built(lambda: L.BatchNormalization(size, dtype=dtype, **kwargs), dtype)
    ours = built(lambda: S.BatchNormalization(size, dtype=dtype, **kwargs, grid=grid), dtype)
    rng = np.random.RandomState(9)
    for name in ("gamma", "beta"):
        p = getattr(ref, name, None)
        if p is not None:
            p.array[...] = rng.uniform(0.5, 1.5, p.shape)
            getattr(ours, name).array[...] = p.array
    return ref, ours


def assert_same_statistics(ours, ref, tol, what=""):
    close(ours.avg_mean, ref.avg_mean, tol, f"avg_mean {what}")
    close(ours.avg_var, ref.avg_var, tol, f"avg_var {what}")
    assert ours.N == ref.N


BN_CASES = [
    pytest.param((2, 3, 31, 29), shape.values[0], id=f"image-{shape.id}", marks=shape.marks)
    for shape in GRIDS_2D
] + [
    pytest.param((2, 2, 7, 6, 9), shape.values[0], id=f"volume-{shape.id}", marks=shape.marks)
    for shape in GRIDS_3D[1:]
]


@pytest.mark.parametrize("image, shape", BN_CASES)
@pytest.mark.parametrize("dtype, tol", DTYPES)
def test_batch_normalization_trains_and_tests_as_one_process(grid, image, dtype, tol):
    ref, ours = bn_pair(grid, dtype, size=image[1], decay=0.7)
    for step in range(3):
        x = data(image, dtype, 10 + step, mean=3, std=2)
        assert_transparent(grid, ref, ours, x, tol)
        assert_same_statistics(ours, ref, tol, f"after step {step}")
    assert not (ref.avg_mean == 0).any()  # the statistics moved
    with chainer.using_config("train", False):
        x = data(image, dtype, 20, mean=3, std=2)
        y_ref, gx_ref, w = forward_backward(ref, x, lambda s: data(s, dtype, 21))
        y, gx, _ = forward_backward(ours, grid.tile(x), grid.tile(w))
    close(y, grid.tile(y_ref), tol, "y (test mode)")
    close(gx, grid.tile(gx_ref), tol, "gx (test mode)")
    assert_same_statistics(ours, ref, tol, "after test mode")


@pytest.mark.mpi(min_size=2)
def test_batch_normalization_test_mode_parameter_gradients_are_the_whole_images(world, grids):
    grid = grids((1, world.size))  # every rank in the grid: every rank fails
    ref, ours = bn_pair(grid, np.float64)
    with chainer.using_config("train", False):
        assert_transparent(grid, ref, ours, data(IMAGE, np.float64, 22, 3, 2), 1e-12)


@pytest.mark.parametrize("shape", [on((1, 1), 1), on((1, 3), 3), on((2, 2), 4)])
def test_batch_normalization_without_gamma_and_beta_and_finetuning(grid):
    ref, ours = bn_pair(grid, np.float64, use_gamma=False, use_beta=False)
    assert list(ours.params()) == []
    assert_transparent(grid, ref, ours, data(IMAGE, np.float64, 23, 3, 2), 1e-12)
    for step in range(2):
        x = data(IMAGE, np.float64, 24 + step, 1, 3)
        assert_transparent(grid, ref, ours, x, 1e-12, finetune=True)
        assert_same_statistics(ours, ref, 1e-12, f"after finetuning step {step}")
    assert ours.N == 2


# -- the grid a link holds ------------------------------------------------------------


@pytest.mark.parametrize("shape", [on((1, 1), 1), on((1, 2), 2)])
def test_deepcopy_keeps_the_grid_and_copies_the_parameters(grid):
    links = [S.Convolution2D(3, 4, 3, pad=1, grid=grid),
             S.ConvolutionND(3, 2, 3, 3, grid=grid),
             S.Deconvolution2D(3, 4, 3, grid=grid, overlap=False),
             S.DeconvolutionND(3, 2, 3, 3, grid=grid),
             S.BatchNormalization(3, grid=grid)]
    for link in links:
        other = copy.deepcopy(link)
        assert type(other) is type(link)
        assert other.grid is grid
        assert other.overlap is link.overlap
        for (name, p), q in zip(link.namedparams(), other.params()):
            assert p is not q and p.array is not q.array, name
            np.testing.assert_array_equal(p.array, q.array)
    conv = links[0]
    ref = copy.deepcopy(conv)
    ref.__class__ = L.Convolution2D  # the same parameters, run by chainer on the whole image
    assert_transparent(grid, ref, copy.deepcopy(conv), data(IMAGE, np.float32, 25), 1e-5)
