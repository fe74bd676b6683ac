"""``convert``: a CNN written with chainer's links and functions trains on tiles as in one process.

The same model is built twice with the same seed: one copy trains in one
process on whole images, the other is converted and trains on this rank's
tiles. Losses must be equal at every step, and parameters and batch-norm
statistics after the updates (float64). Images are 17x15, so tiles are
uneven.
"""
import copy
import functools

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from chainer.functions.pooling.max_pooling_nd import max_pooling_2d as chainers_max_pooling_2d

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=1)
TOL = 1e-10
IMAGE = (2, 3, 17, 15)


def on(shape, ranks):
    """A grid shape as a parameter, for ``ranks`` ranks or more."""
    return pytest.param(shape, id="x".join(map(str, shape)), marks=pytest.mark.mpi(min_size=ranks))


GRIDS = [on((1, 1), 1), on((1, 2), 2), on((2, 1), 2), on((1, 3), 3), on((3, 1), 3),
         on((2, 2), 4)]
OPTIMIZERS = {
    "Adam": lambda: chainer.optimizers.Adam(alpha=0.01),
    "MomentumSGD": lambda: chainer.optimizers.MomentumSGD(lr=0.05),
}


class Net(chainer.Chain):
    """Convolution, batch norm, max pooling, a strided convolution, average pooling and a
    deconvolution back to (almost) the input's size: the functions are called in forward."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 4, 3, pad=1)
            self.bn1 = L.BatchNormalization(4)
            self.conv2 = L.Convolution2D(4, 6, 3, stride=2, pad=1)
            self.bn2 = L.BatchNormalization(6, decay=0.5)
            self.up = L.Deconvolution2D(6, 3, 4, stride=2, pad=1)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pooling_2d(h, 3, stride=1, pad=1)
        h = F.relu(self.bn2(self.conv2(h)))
        h = F.average_pooling_2d(h, 3, 1, 1)
        return self.up(h)


def sequential():
    """A Sequential whose entries are chainer's pooling functions, bare and partial."""
    return chainer.Sequential(
        L.Convolution2D(3, 4, 3, pad=1), L.BatchNormalization(4), F.relu,
        functools.partial(F.max_pooling_2d, ksize=2),  # stride 2, cover_all: 17x15 -> 9x8
        L.Convolution2D(4, 4, 3, pad=1),
        lambda h: (h, 3, 1, 1), F.max_pooling_2d,      # F.max_pooling_2d(h, 3, 1, 1)
        functools.partial(F.average_pooling_2d, ksize=2, stride=1),
        L.Deconvolution2D(4, 3, 2, stride=2))


class Classifier(chainer.Chain):
    """A convolutional body, then the whole feature map into a fully connected layer."""

    grid = None  # set on the spatial copy: gather the tiles before the head

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 4, 3, pad=1)
            self.bn = L.BatchNormalization(4)
            self.conv2 = L.Convolution2D(4, 4, 3, stride=2, pad=1)
            self.fc = L.Linear(4 * 5 * 4, 5)

    def forward(self, x):
        h = F.max_pooling_2d(F.relu(self.bn(self.conv1(x))), 2)  # 17x15 -> 9x8
        h = F.relu(self.conv2(h))                                 # 5x4
        if self.grid is not None:
            h = S.gather(h, self.grid)
        return self.fc(h)


def twins(make):
    """Two copies of a model from the same seed, float64: one to convert, one to keep."""
    models = []
    for _ in range(2):
        np.random.seed(0)
        with chainer.using_config("dtype", np.float64):
            models.append(make())
    return models


def batch(step, target):
    rng = np.random.RandomState(100 + step)
    return rng.standard_normal(IMAGE), target(rng)


def close(actual, expected, what):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=TOL, atol=TOL, err_msg=what)


def assert_same_model(ours, ref, what):
    theirs = dict(ref.namedparams())
    mine = dict(ours.namedparams())
    assert sorted(mine) == sorted(theirs)
    for name, p in theirs.items():
        close(mine[name].array, p.array, f"{name} {what}")
    bns = [(path, link) for path, link in ref.namedlinks()
           if isinstance(link, L.BatchNormalization)]
    assert bns
    mine_links = dict(ours.namedlinks())
    for path, link in bns:
        close(mine_links[path].avg_mean, link.avg_mean, f"{path}/avg_mean {what}")
        close(mine_links[path].avg_var, link.avg_var, f"{path}/avg_var {what}")


def train_both(grid, make, optimizer, target, loss_of, spatial_loss_of, steps=3, convert=None):
    """``steps`` updates of a model in one process and of its converted twin on tiles."""
    ours, ref = twins(make)
    opt, ref_opt = optimizer().setup(ours), optimizer().setup(ref)
    assert_same_model(ours, ref, "at the start")
    (convert or S.convert)(ours, grid)  # after setup: the optimizer keeps its parameters
    return ref, train(grid, ours, ref, opt, ref_opt, target, loss_of, spatial_loss_of, steps)


def train(grid, ours, ref, opt, ref_opt, target, loss_of, spatial_loss_of, steps):
    for step in range(steps):
        x, t = batch(step, target)
        with chainer.using_config("dtype", np.float64):
            ref_loss = loss_of(ref(x), t)
            loss = spatial_loss_of(ours(grid.tile(x)), t)
        for model, value, o in ((ref, ref_loss, ref_opt), (ours, loss, opt)):
            model.cleargrads()
            value.backward()
            o.update()
        assert F.max_pooling_2d is chainers_max_pooling_2d
        close(loss.array, ref_loss.array, f"loss at step {step}")
    assert_same_model(ours, ref, f"after {steps} updates")
    return ours


def image_target(rng):
    return rng.standard_normal(IMAGE)


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS.values()), ids=list(OPTIMIZERS))
def test_a_converted_cnn_trains_as_one_process(grid, optimizer):
    out = (IMAGE[0], 3, 18, 16)
    ref, ours = train_both(grid, Net, optimizer, lambda rng: rng.standard_normal(out),
                           F.mean_squared_error,
                           lambda y, t: S.mean_squared_error(y, grid.tile(t), grid))
    x, _ = batch(9, image_target)
    with chainer.using_config("train", False), chainer.using_config("dtype", np.float64):
        close(ours(grid.tile(x)).array, grid.tile(ref(x).array), "y in test mode")
    assert isinstance(ours, Net) and ours.conv1.grid is grid and ours.bn2.grid is grid
    assert isinstance(ours.conv2, S.Convolution2D) and isinstance(ours.up, S.Deconvolution2D)
    other = copy.deepcopy(ours)
    assert other.conv1.grid is grid and other._spatial[0] is grid
    assert other.conv1.W is not ours.conv1.W


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_a_converted_sequential_with_pooling_entries_trains_as_one_process(grid,
                                                                          overlap):
    out = (IMAGE[0], 3, 16, 14)
    _, ours = train_both(grid, sequential, OPTIMIZERS["Adam"],
                         lambda rng: rng.standard_normal(out), F.mean_squared_error,
                         lambda y, t: S.mean_squared_error(y, grid.tile(t), grid),
                         convert=functools.partial(S.convert, overlap=overlap))
    assert ours[0].overlap is overlap
    assert isinstance(ours[0], S.Convolution2D) and isinstance(ours[1], S.BatchNormalization)
    # The entries stay chainer's: the guard converts the nodes they make.
    assert ours[3].func is F.max_pooling_2d and ours[6] is F.max_pooling_2d


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS.values()), ids=list(OPTIMIZERS))
def test_a_classifier_with_gather_and_a_linear_head_trains_as_one_process(grid,
                                                                         optimizer):

    def convert(model, grid):
        S.convert(model, grid)
        model.grid = grid

    _, ours = train_both(grid, Classifier, optimizer,
                         lambda rng: rng.randint(0, 5, IMAGE[0]).astype(np.int32),
                         F.softmax_cross_entropy, F.softmax_cross_entropy, convert=convert)
    assert isinstance(ours.fc, S.Linear) and not ours.fc.is_sharded  # whole images: not cut


@pytest.mark.parametrize("shape", [on((1, 1), 1), on((1, 2), 2)])
def test_chainers_functions_are_chainers_again_after_a_converted_forward(grid, shape):
    names = ("convolution_2d", "convolution_nd", "deconvolution_2d", "deconvolution_nd",
             "max_pooling_2d", "max_pooling_nd", "average_pooling_2d", "average_pooling_nd")
    before = {name: getattr(F, name) for name in names}
    assert all(fn.__module__.startswith("chainer.functions.") for fn in before.values())
    model = twins(Net)[0]
    assert S.convert(model, grid) is model
    x = np.random.RandomState(1).standard_normal(IMAGE)
    with chainer.using_config("dtype", np.float64):
        model(grid.tile(x))
        assert {name: getattr(F, name) for name in names} == before
        # chainer's own pooling on the whole image again, outside the model
        whole = F.max_pooling_2d(x, 3, 1, 1)
        assert whole.shape == x.shape

        def fail(h):
            raise RuntimeError("inside forward")

        model.conv1.forward = fail  # an error inside the converted forward
        with pytest.raises(RuntimeError, match="inside forward"):
            model(grid.tile(x))
    assert {name: getattr(F, name) for name in names} == before
    assert F.max_pooling_2d is chainers_max_pooling_2d


class Pooled(chainer.Chain):
    """Average pooling (3, 1, 1) of the input, gathered first where ``grid`` is set."""

    grid = None

    def forward(self, x):
        h = x if self.grid is None else S.gather(x, self.grid)
        return F.average_pooling_2d(h, 3, 1, 1)


@pytest.mark.mpi(min_size=2)
def test_pooling_after_gather_in_a_converted_forward_sees_the_whole_image(world, grids):
    grid = grids((1, world.size))  # every rank in the grid: every rank fails
    x = np.arange(1, 9, dtype=np.float64).reshape(1, 1, 2, 4)
    model = S.convert(Pooled(), grid)
    model.grid = grid
    y = model(grid.tile(x))
    close(y.array, F.average_pooling_2d(x, 3, 1, 1).array, "y")


class CallStyle(chainer.Chain):
    """A chainer v1-style model: ``__call__`` instead of ``forward``."""

    def __call__(self, x):
        return F.average_pooling_2d(x, 3, 1, 1)


@pytest.mark.mpi(min_size=2)
def test_a_converted_model_that_defines_call_pools_the_whole_image(world, grids):
    grid = grids((1, world.size))
    x = np.arange(1, 9, dtype=np.float64).reshape(1, 1, 2, 4)
    y = S.convert(CallStyle(), grid)(grid.tile(x))
    close(y.array, grid.tile(F.average_pooling_2d(x, 3, 1, 1).array), "y")
