"""Spatial convolutions and pooling against chainer's own ``F.*`` on the whole image.

Transparency: every rank draws the whole input, the weights and a random
upstream gradient from one seed, runs chainer's function on the whole image
in one process, and runs its tile through ``mnpar.spatial``'s function over
the grid. Outputs, input gradients and weight and bias gradients must agree::

    y_tile == grid.tile(y)    x_tile.grad == grid.tile(x.grad)    W.grad == W.grad

Every rank computes everything first and the verdicts are gathered over the
grid before any assert, so a failure on one rank fails every rank alike and
no rank is left waiting in a collective.

The geometries are a table, not the cross product: every kernel (1, 2, 3, 5),
stride (1, 2, 3), padding (0, 1, 2), dilation (1, 2), ``cover_all`` and
``overlap`` value appears, on odd images (31 x 29) over every grid.
"""
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import chainer
import chainer.functions as F
import numpy as np
import pytest

from mnpar import spatial
from mnpar.spatial.operations import _window_op

IMAGE = (2, 3, 31, 29)  # N, C, H, W: odd sizes, so tiles differ in size
VOLUME = (2, 3, 9, 7, 11)
OUT_CHANNELS = 4
# relative to the largest value compared: a float32 weight gradient sums some
# thousand products, and chainer's own order of summation differs from the tiles'
TOL = {np.float32: 1e-5, np.float64: 1e-10}

GRIDS_2D = [
    pytest.param((1, 2), id="1x2", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((2, 1), id="2x1", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((1, 3), id="1x3", marks=pytest.mark.mpi(min_size=3)),
    pytest.param((3, 1), id="3x1", marks=pytest.mark.mpi(min_size=3)),
    pytest.param((2, 2), id="2x2", marks=pytest.mark.mpi(min_size=4)),
]
GRIDS_3D = [
    pytest.param((1, 1, 2), id="1x1x2", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((2, 1, 1), id="2x1x1", marks=pytest.mark.mpi(min_size=2)),
]


class Case(NamedTuple):
    """One layer: chainer's function, mnpar's, their shared arguments, and the weights."""

    name: str
    whole: Any
    tiled: Any
    kwargs: Dict[str, Any]
    weights: Optional[Tuple[int, ...]]  # W's shape, None for pooling
    bias: Optional[int]                 # b's size, None for none
    overlap: bool
    dtype: Any

    def __repr__(self) -> str:
        return self.name


def _tag(dtype, overlap, bias=True) -> str:
    return (f"{np.dtype(dtype).name}{'' if overlap else '-sync'}"
            f"{'' if bias else '-nobias'}")


def conv(k, s=1, p=0, d=1, cover_all=False, overlap=True, dtype=np.float64, bias=True, nd=2):
    ks = k if isinstance(k, tuple) else (k,) * nd
    whole, tiled = ((F.convolution_2d, spatial.convolution_2d) if nd == 2
                    else (F.convolution_nd, spatial.convolution_nd))
    name = (f"conv{nd}d-k{k}s{s}p{p}d{d}{'-cover_all' if cover_all else ''}-"
            f"{_tag(dtype, overlap, bias)}")
    return Case(name, whole, tiled, dict(stride=s, pad=p, dilate=d, cover_all=cover_all),
                (OUT_CHANNELS, IMAGE[1]) + ks, OUT_CHANNELS if bias else None, overlap, dtype)


def deconv(k, s=1, p=0, d=1, outsize=None, overlap=True, dtype=np.float64, bias=True, nd=2):
    ks = k if isinstance(k, tuple) else (k,) * nd
    whole, tiled = ((F.deconvolution_2d, spatial.deconvolution_2d) if nd == 2
                    else (F.deconvolution_nd, spatial.deconvolution_nd))
    name = (f"deconv{nd}d-k{k}s{s}p{p}d{d}{f'-out{outsize}' if outsize else ''}-"
            f"{_tag(dtype, overlap, bias)}")
    return Case(name, whole, tiled, dict(stride=s, pad=p, dilate=d, outsize=outsize),
                (IMAGE[1], OUT_CHANNELS) + ks, OUT_CHANNELS if bias else None, overlap, dtype)


def max_pool(k, s, p=0, cover_all=True, overlap=True, dtype=np.float64, nd=2):
    whole, tiled = ((F.max_pooling_2d, spatial.max_pooling_2d) if nd == 2
                    else (F.max_pooling_nd, spatial.max_pooling_nd))
    name = (f"maxpool{nd}d-k{k}s{s}p{p}{'-cover_all' if cover_all else ''}-"
            f"{_tag(dtype, overlap)}")
    return Case(name, whole, tiled, dict(ksize=k, stride=s, pad=p, cover_all=cover_all),
                None, None, overlap, dtype)


def avg_pool(k, s, p=0, overlap=True, dtype=np.float64, nd=2):
    whole, tiled = ((F.average_pooling_2d, spatial.average_pooling_2d) if nd == 2
                    else (F.average_pooling_nd, spatial.average_pooling_nd))
    name = f"avgpool{nd}d-k{k}s{s}p{p}-{_tag(dtype, overlap)}"
    return Case(name, whole, tiled, dict(ksize=k, stride=s, pad=p), None, None, overlap, dtype)


f32 = np.float32
CASES_2D = [
    conv(3, 1, 1),
    conv(5, 2, 2, dtype=f32),
    conv(2, 3, 0, 2, overlap=False),
    conv(1, 1, 2, dtype=f32),
    conv(3, 2, 0, 2, cover_all=True),
    conv(5, 3, 1, cover_all=True, dtype=f32, overlap=False),
    conv(2, 1, 1, bias=False),
    conv((3, 2), (2, 1), (0, 2), (1, 2)),
    deconv(3, 1, 1),
    deconv(2, 2, 0, dtype=f32),
    deconv(3, 2, 1, outsize=(62, 58)),
    deconv(5, 3, 2, overlap=False),
    deconv(1, 3, 0),
    deconv(3, 1, 2, 2, dtype=f32, bias=False),
    deconv(2, 3, 1, 2, overlap=False, dtype=f32),
    deconv(5, 2, 0, 2),
    max_pool(2, 2),
    max_pool(3, 2, 1),
    max_pool(3, 3, 0, cover_all=False),
    max_pool(5, 3, 2),
    max_pool(2, 1, 1, cover_all=False, dtype=f32),
    max_pool(1, 2, 0),
    max_pool(5, 2, 2, cover_all=False, overlap=False),
    max_pool(3, 1, 1, overlap=False, dtype=f32),
    max_pool(3, None, 1),
    avg_pool(2, 2),
    avg_pool(3, 1, 1),
    avg_pool(3, 3, 1, dtype=f32),
    avg_pool(5, 2, 2, overlap=False),
    avg_pool(1, 3, 0),
    avg_pool(2, 3, 1, overlap=False, dtype=f32),
    avg_pool(2, None, 0, dtype=f32),
]
CASES_3D = [
    conv(3, 1, 1, nd=3),
    conv((3, 2, 5), (1, 2, 3), (1, 0, 2), (2, 1, 1), dtype=f32, overlap=False, nd=3),
    max_pool(3, 2, 1, nd=3),
    max_pool(2, 3, 0, cover_all=False, dtype=f32, nd=3),
    deconv(3, 2, 1, nd=3),
    deconv(2, 1, 0, 2, overlap=False, dtype=f32, nd=3),
    avg_pool(3, 2, 1, nd=3),
]


def _values(case: Case, key: str) -> set:
    value = case.kwargs.get(key)
    return set(value) if isinstance(value, tuple) else {value}


@pytest.mark.parametrize("family", ["conv", "deconv", "maxpool", "avgpool"])
def test_the_table_holds_every_listed_value(family):
    cases = [c for c in CASES_2D if c.name.startswith(family)]
    kernels = set().union(*(_values(c, "ksize") if c.weights is None else set(c.weights[2:])
                            for c in cases))
    assert kernels >= {1, 2, 3, 5}
    assert set().union(*(_values(c, "stride") for c in cases)) >= {1, 2, 3}
    assert set().union(*(_values(c, "pad") for c in cases)) >= {0, 1, 2}
    assert {c.overlap for c in cases} == {False, True}
    assert {c.dtype for c in cases} == {np.float32, np.float64}
    if family in ("conv", "deconv"):
        assert set().union(*(_values(c, "dilate") for c in cases)) >= {1, 2}
    if family in ("conv", "maxpool"):
        assert set().union(*(_values(c, "cover_all") for c in cases)) == {False, True}


def difference(name: str, got: Any, want: Any, dtype: Any) -> Optional[str]:
    """Why ``got`` is not ``want`` to ``dtype``'s tolerance, or None."""
    if got is None or want is None:
        return None if got is None and want is None else f"{name}: got {got!r}, want {want!r}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{name}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    try:
        np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * scale,
                                   err_msg=name)
    except AssertionError as error:
        return str(error)
    return None


def assert_agreed(grid, problems: List[str]) -> None:
    """Fails on every rank alike if any rank of the grid's communicator found a problem."""
    everyone = grid.comm.allreduce_obj([f"rank {grid.comm.rank} {p}" for p in problems])
    assert not everyone, "\n".join(everyone)


def run_case(grid, case: Case, shape) -> Tuple[Any, List[str]]:
    """``case`` on the whole image in one process and on this rank's tile; the problems."""
    rng = np.random.RandomState(7)
    dtype = case.dtype
    x = rng.uniform(-1, 1, shape).astype(dtype)
    params = []
    if case.weights is not None:
        params.append(rng.uniform(-1, 1, case.weights).astype(dtype))
        params.append(None if case.bias is None else rng.uniform(-1, 1, case.bias).astype(dtype))

    xv = chainer.Variable(x.copy())
    pv = [None if p is None else chainer.Variable(p.copy()) for p in params]
    y = case.whole(xv, *pv, **case.kwargs)
    gy = rng.standard_normal(y.shape).astype(dtype)
    y.grad = gy.copy()
    y.backward()

    xt = chainer.Variable(grid.tile(x))
    pt = [None if p is None else chainer.Variable(p.copy()) for p in params]
    yt = case.tiled(xt, *pt, grid=grid, overlap=case.overlap, **case.kwargs)
    want_y = grid.tile(y.array)
    # a wrong output shape still runs the backward on every rank (zeros), then fails
    yt.grad = grid.tile(gy) if yt.shape == want_y.shape else np.zeros(yt.shape, dtype)
    yt.backward()

    problems = [difference("y", yt.array, want_y, dtype),
                difference("x.grad", xt.grad, grid.tile(xv.grad), dtype)]
    for name, a, b in zip(("W.grad", "b.grad"), pt, pv):
        if a is not None:
            problems.append(difference(name, a.grad, b.grad, dtype))
    # replicated parameters stay replicated: their gradients are the same bits on every rank
    mine = [a.grad for a in pt if a is not None]
    for r, theirs in enumerate(grid.spatial_comm.allgather_obj(mine)):
        if not all(np.array_equal(g, h) for g, h in zip(mine, theirs)):
            problems.append(f"the parameter gradients differ from grid rank {r}'s")
    return yt, [f"{case.name}: {p}" for p in problems if p]


@pytest.mark.parametrize("case", CASES_2D, ids=repr)
@pytest.mark.parametrize("shape", GRIDS_2D)
def test_2d_layers_equal_chainers_on_the_whole_image(grid, case):
    _, problems = run_case(grid, case, IMAGE)
    assert_agreed(grid, problems)


@pytest.mark.parametrize("case", CASES_3D, ids=repr)
@pytest.mark.parametrize("shape", GRIDS_3D)
def test_nd_layers_equal_chainers_on_the_whole_volume(grid, case):
    _, problems = run_case(grid, case, VOLUME)
    assert_agreed(grid, problems)


CHUNKED = [conv(5, 1, 2), deconv(3, 2, 1, dtype=f32), max_pool(3, 2, 1), avg_pool(3, 1, 1)]


@pytest.mark.parametrize("case", CHUNKED, ids=repr)
@pytest.mark.parametrize("shape", [
    pytest.param((1, 2), id="1x2", marks=pytest.mark.mpi(min_size=2)),
    pytest.param((2, 2), id="2x2", marks=pytest.mark.mpi(min_size=4)),
])
def test_the_interior_in_chunks_gives_the_same_result(grid, monkeypatch, case):
    monkeypatch.setattr(_window_op, "CHUNK_BYTES", 0)
    yt, problems = run_case(grid, case, IMAGE)
    node = yt.creator
    early = sum(piece.early for piece in node.pieces)
    halo = any(p.lo or p.hi for p in node.layout.plans)
    if halo and early != _window_op.CHUNKS:  # a rank with no halo has one piece
        problems.append(f"{early} pieces computed while the halo travels, "
                        f"not {_window_op.CHUNKS} chunks")
    if not grid.comm.allreduce_obj(int(early == _window_op.CHUNKS)):
        problems.append("no rank computed its interior in chunks")
    assert_agreed(grid, problems)


@pytest.mark.mpi(min_size=2)
def test_a_halo_above_chunk_bytes_is_chunked_and_exact(grids):
    # two columns of 2 x 32 x 80 float64 from the one neighbour: 80 KiB
    shape = (2, 32, 80, 41)
    case = conv(5, 1, 2)._replace(weights=(OUT_CHANNELS, 32, 5, 5))
    grid = grids((1, 2))
    yt, problems = run_case(grid, case, shape)
    halo = yt.creator.layout.plans[1]
    nbytes = 8 * (halo.lo + halo.hi) * 2 * 32 * 80
    early = sum(piece.early for piece in yt.creator.pieces)
    if nbytes <= _window_op.CHUNK_BYTES or early != _window_op.CHUNKS:
        problems.append(f"a halo of {nbytes} bytes (CHUNK_BYTES {_window_op.CHUNK_BYTES}) "
                        f"made {early} early pieces")
    assert_agreed(grid, problems)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", [conv(3, 1, 1), conv(2, 2, 0), max_pool(3, 2, 1),
                                  deconv(3, 2, 1)], ids=repr)
def test_one_sample_at_a_time_gives_the_same_result(grids, monkeypatch, case):
    # Large outputs run one sample at a time (chainer's batched product copies
    # its columns); force it on a small image and check every piece is one sample.
    monkeypatch.setattr(_window_op, "SAMPLE_PIXELS", 1)
    grid = grids((1, 2))
    yt, problems = run_case(grid, case, IMAGE)
    samples = {piece.out[0].stop - piece.out[0].start for piece in yt.creator.pieces}
    if samples != {1}:
        problems.append(f"pieces of {samples} samples, not 1")
    assert_agreed(grid, problems)


@pytest.mark.mpi(min_size=1)
def test_second_order_gradients_are_refused_not_silently_none(grids):
    # chainer.grad(..., enable_double_backprop=True) used to give None for a
    # spatial layer's second-order gradients, with no error.
    grid = grids((1, 1))
    x = chainer.Variable(np.random.RandomState(0).randn(1, 1, 5, 5))
    W = chainer.Variable(np.random.RandomState(1).randn(1, 1, 3, 3))
    y = spatial.convolution_2d(x, W, pad=1, grid=grid)
    with pytest.raises(NotImplementedError, match="spatial convolution has no second-order"):
        chainer.grad([F.sum(y * y)], [x], enable_double_backprop=True)
