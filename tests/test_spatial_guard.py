"""The guard: in a converted model every function on a tile is exact, converted or refused.

Parameters that meet tiles outside the spatial layers (``L.Scale``,
``L.Bias``, ``L.PReLU``, ``F.swish``'s beta, fixed batch normalization's
statistics, a user's own link) must get the whole image's gradient on every
rank, so any optimizer keeps the replicas equal; a refusal is a
``SpatialError`` on every rank naming the function, the layer and the fix.
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from spatial_twins import Body, Scalar, converted, on, same_as_one_process

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=1)
IMAGE = (2, 3, 9, 11)


GRIDS = [on((1, 1), 1), on((1, 2), 2), on((2, 1), 2), on((1, 3), 3), on((2, 2), 4)]


class Offset(chainer.Link):
    """A user's own link: a learned offset per channel, added by broadcasting."""

    def __init__(self, channels):
        super().__init__()
        with self.init_scope():
            self.c = chainer.Parameter(np.linspace(-1, 1, channels).reshape(1, channels, 1, 1))

    def forward(self, x):
        return x + self.c


class Stats(chainer.Link):
    """Learned statistics for ``F.fixed_batch_normalization``."""

    def __init__(self, channels):
        super().__init__()
        with self.init_scope():
            for name, value in (("gamma", 1.5), ("beta", 0.1), ("mean", 0.2), ("var", 2.0)):
                setattr(self, name, chainer.Parameter(np.full(channels, value)))

    def forward(self, x):
        return F.fixed_batch_normalization(x, self.gamma, self.beta, self.mean, self.var)


def parameters_after_the_convolution():
    return Body(lambda s, x: s.l6(s.l5(F.swish(s.l4(s.l3(s.l2(s.l1(s.l0(x))))), s.l7.b))),
                L.Convolution2D(3, 4, 3, pad=1), L.Scale(axis=1, W_shape=(4,)),
                L.Bias(axis=1, shape=(4,)), L.PReLU((4,)), Offset(4), Stats(4), Scalar(),
                L.Bias(axis=1, shape=(4,)))


@pytest.mark.parametrize("shape", GRIDS)
def test_parameters_that_meet_tiles_get_the_whole_images_gradient(grid):
    x = np.random.RandomState(1).standard_normal(IMAGE)
    same_as_one_process(grid, parameters_after_the_convolution, x)


@pytest.mark.parametrize("shape", [on((1, 2), 2)])
def test_replicas_stay_equal_through_updates(grid):
    # The bug: L.Scale after a convolution took its gradient from the tile alone, and the
    # replicas drifted apart with every update.
    model = converted(grid, parameters_after_the_convolution)
    opt = chainer.optimizers.SGD(0.1).setup(model)
    for step in range(2):
        x = np.random.RandomState(step).standard_normal(IMAGE)
        model.cleargrads()
        S.sum_over_grid(F.sum(model(grid.tile(x)) ** 2), grid).backward()
        opt.update()
    for name, p in sorted(model.namedparams()):
        every = grid.mpi.allgather(p.array)
        assert all(np.array_equal(every[0], a) for a in every), name


class TwoImages(chainer.Chain):
    def forward(self, a, b):
        return F.add(a, b)


@pytest.mark.parametrize("shape", [on((1, 2), 2), on((1, 3), 3)])
def test_tiles_of_different_images_meeting_are_an_error_on_every_rank(grid):
    # 10 and 11 columns over 2 or 3 ranks: some ranks hold tiles of the same shape
    a = grid.tile(np.zeros((1, 1, 4, 10)))
    b = grid.tile(np.zeros((1, 1, 4, 11)))
    with pytest.raises(S.SpatialError, match=r"F.add \(Add\) in the forward of TwoImages cannot "
                       r"run on tiles of the spatial grid: tiles of different images meet in "
                       r"it: a tile of an image of extents \(4, 10\) .* and a tile of an image "
                       r"of extents \(4, 11\)"):
        S.convert(TwoImages(), grid)(a, b)


class Block(chainer.Chain):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class Outer(chainer.Chain):
    def __init__(self, fn):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, 4, 3, pad=1)
            self.block = Block(fn)

    def forward(self, x):
        return self.block(self.conv(x))


REFUSED = [
    (lambda h: F.cumsum(h, axis=3), r"F.cumsum \(Cumsum\) in layer '/block' \(Block\) cannot "
     r"run on tiles of the spatial grid: it works along split axis 3, on tiles rather than "
     r"images; call mnpar.spatial.gather\(h, grid\) first"),
    (lambda h: F.reshape(h, (2, 4, -1)), r"F.reshape \(Reshape\) in layer '/block' .* mixing "
     r"the split axes with others; for a fully connected layer use mnpar.spatial.Linear"),
    (lambda h: F.softmax_cross_entropy(h, np.zeros((2, 9, 11), np.int32)),
     r"F.softmax_cross_entropy \(SoftmaxCrossEntropy\) in layer '/block' .* it reduces over "
     r"the whole array \(reduce='mean'\); compute the loss outside the converted model"),
    (lambda h: F.max_pooling_2d(h, 2, return_indices=True), r"F.max_pooling_nd "
     r"\(MaxPoolingND\) in layer '/block' .* return_indices gives indexes into this rank's "
     r"tile, not the image; call mnpar.spatial.gather"),
    (lambda h: F.batch_normalization(h, np.ones(4), np.zeros(4)),
     r"F.batch_normalization \(BatchNormalization\) .* it normalizes over this rank's pixels "
     r"only; use chainer.links.BatchNormalization"),
    (lambda h: S.sum_over_grid(F.sum(h), None), "sum_over_grid needs a SpatialGrid"),
    (lambda h: h + np.ones((1, 1, 9, 11)), r"its input 1 \(shape \(1, 1, 9, 11\)\) is not a "
     r"tile, and varies along a split axis"),
    (lambda h: F.concat((h, chainer.Variable(np.ones(h.shape)))), r"F.concat \(Concat\) .* "
     r"its input 1 \(shape \(2, 4, .*\)\) is not a tile and has a gradient"),
    (lambda h: F.spatial_transformer_sampler(h, np.zeros((2, 2, 9, 11))),
     r"F.spatial_transformer_sampler \(SpatialTransformerSampler\) in layer '/block' "
     r"\(Block\) cannot run on tiles of the spatial "
     r"grid: it is not known to be exact on tiles"),
]


@pytest.mark.parametrize("shape", [on((1, 2), 2), on((2, 2), 4)])
@pytest.mark.parametrize("fn, match", REFUSED, ids=[
    "cumsum along a split axis", "reshape across pixels", "a mean loss", "return_indices",
    "F.batch_normalization", "sum_over_grid without a grid", "a whole-image constant",
    "a variable of the tile's shape", "an unknown function"])
def test_a_refusal_names_the_function_the_layer_and_the_fix_on_every_rank(grid, fn,
                                                                          match):
    model = converted(grid, lambda: Outer(fn))
    x = np.random.RandomState(1).standard_normal(IMAGE)
    with pytest.raises((S.SpatialError, TypeError), match=match):
        model(grid.tile(x))
    assert chainer.FunctionNode.apply is chainer.function_node.FunctionNode.__dict__["apply"]
    assert "mnpar.spatial.guard" not in chainer._get_link_hooks()


@pytest.mark.parametrize("shape", [on((1, 2), 2)])
def test_sum_over_grid_inside_a_converted_model_is_an_error(grid):
    model = converted(grid, lambda: Outer(lambda h: S.sum_over_grid(F.sum(h), grid)))
    with pytest.raises(S.SpatialError, match="sum_over_grid inside a converted model"):
        model(grid.tile(np.random.RandomState(1).standard_normal(IMAGE)))


@pytest.mark.parametrize("shape", [on((1, 2), 2)])
def test_a_spatial_function_given_the_whole_image_is_an_error(grid):
    model = converted(grid, lambda: Outer(lambda h: S.max_pooling_2d(S.gather(h, grid), 2,
                                                                      grid=grid)))
    with pytest.raises(S.SpatialError, match=r"spatial max pooling receives the whole image "
                       r"\(the same on every rank\), not \(N, C, \*spatial\) tiles"):
        model(grid.tile(np.random.RandomState(1).standard_normal(IMAGE)))


@pytest.mark.parametrize("shape", [on((1, 2), 2), on((2, 2), 4)])
def test_constants_of_the_tiles_shape_and_chainers_functions_after_gather_are_exact(grid):

    def fn(model, h):
        h = F.where(h.array > 0, h, h * 0.1)           # a mask made from the tile's values
        whole = S.gather(h, grid) if hasattr(model, "_spatial") else h
        return F.sum(F.max_pooling_2d(whole, 2), axis=(2, 3))   # chainer's own, whole images

    x = np.random.RandomState(1).standard_normal(IMAGE)
    make = lambda: Body(lambda s, x: fn(s, s.l1(s.l0(x))),  # noqa: E731
                        L.Convolution2D(3, 4, 3, pad=1), L.Scale(axis=1, W_shape=(4,)))
    same_as_one_process(grid, make, x, tiled=False)
