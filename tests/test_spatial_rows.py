"""Padding, slicing and flipping along split axes, and unpooling, against one process.

Each moves rows between ranks (``TakeRows``: one ``Alltoallv`` along the
grid's line) or, for unpooling, runs as a transposed window. The padding
modes copy border rows whose gradient chainer drops (its ``Pad`` backward
crops), and so does the spatial version: the gradients equal one process's
exactly as chainer computes them. Odd images (9 x 11), float64.
"""
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from spatial_twins import GRIDS, Body, Scalar, converted, on, same_as_one_process

import mnpar

S = mnpar.spatial
pytestmark = pytest.mark.mpi(min_size=1)
IMAGE = (2, 3, 9, 11)


def head(fn):
    """A convolution, then ``fn``, then a learned factor (a parameter after the rows move)."""
    return lambda: Body(lambda s, x: s.l1(fn(s.l0(x))), L.Convolution2D(3, 4, 3, pad=1),
                        Scalar())


CASES = {
    "pad constant 0": lambda h: F.pad(h, ((0, 0), (0, 0), (1, 2), (3, 1)), "constant"),
    "pad constant 0.5, wider than a tile": lambda h: F.pad(
        h, ((0, 0), (0, 0), (4, 0), (0, 5)), "constant", constant_values=0.5),
    "pad edge, channels too": lambda h: F.pad(h, ((0, 0), (1, 1), (2, 1), (1, 3)), "edge"),
    "pad wrap": lambda h: F.pad(h, ((0, 0), (0, 0), (2, 3), (4, 2)), "wrap"),
    "pad wrap, more than the image": lambda h: F.pad(h, ((0, 0), (0, 0), (10, 1), (0, 12)),
                                                     "wrap"),
    "pad reflect": lambda h: F.pad(h, ((0, 0), (0, 0), (3, 2), (2, 4)), "reflect"),
    "pad symmetric": lambda h: F.pad(h, ((0, 0), (0, 0), (1, 3), (3, 1)), "symmetric"),
    "pad one width": lambda h: F.pad(h, 1, "constant"),
    "crop": lambda h: h[:, :, 1:-1, 2:-3],
    "stride 2, channels reversed": lambda h: h[:, ::-1, ::2, 1::2],
    "reversed with a step": lambda h: h[..., ::-1, 8:1:-2],
    "flip rows": lambda h: F.flip(h, 2),
    "flip columns": lambda h: F.flip(h, -1),
    "flip channels": lambda h: F.fliplr(h),
    "unpool 2": lambda h: F.unpooling_2d(h, 2),
    "unpool 3, stride 2, pad 1": lambda h: F.unpooling_2d(h, 3, 2, 1, cover_all=False),
    "unpool 3, stride 2, cover_all": lambda h: F.unpooling_2d(h, 3, 2),
    "unpool to an outsize": lambda h: F.unpooling_2d(h, 2, outsize=(18, 22), cover_all=False),
    "unpool nd": lambda h: F.unpooling_nd(h, (2, 3), (2, 2), cover_all=False),
}


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_rows_along_split_axes_move_as_in_one_process(grid, case):
    x = np.random.RandomState(1).standard_normal(IMAGE)
    same_as_one_process(grid, head(CASES[case]), x)


@pytest.mark.parametrize("shape", [on((1, 2), 2), on((2, 2), 4)])
@pytest.mark.parametrize("call, match", [
    (lambda h: F.pad(h, ((0, 0), (0, 0), (1, 1), (1, 1)), "maximum"),
     r"F.pad \(Pad\) in the forward of Body cannot run on tiles of the spatial grid: "
     r"mode='maximum' is not supported along split axes"),
    (lambda h: h[:, :, 3], r"F.get_item \(GetItem\) .* it picks one row of split axis 2"),
    (lambda h: h[:, :, [1, 2]], "it indexes a tile with arrays"),
    (lambda h: h[None, :, :, 1:], "it slices a split axis and also picks or adds axes"),
    (lambda h: h[:, :, :, :1], r"the output has 1 rows along split axis 1, fewer than the 2 "
                               "ranks"),
], ids=["pad maximum", "an int on a split axis", "an index array", "a slice and None",
        "a slice too thin"])
def test_what_moving_rows_cannot_do_is_an_error_on_every_rank(grid, call, match):
    model = converted(grid, head(call))
    with pytest.raises(S.SpatialError, match=match):
        model(grid.tile(np.random.RandomState(1).standard_normal(IMAGE)))
