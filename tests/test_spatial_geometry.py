"""The geometry of spatial layers, in one process: no MPI.

Each rank's plan is checked against first principles: the rows it gathers
(own, received, padding, less the trimmed ones), run through the layer with
padding 0, give exactly its slice of the global layer's output.
"""
import itertools
import re

import chainer.functions as F
import numpy as np
import pytest
from chainer.utils import conv

from mnpar.spatial.traffic._geometry import (
    GeometryError,
    Window,
    _problem,
    halo_plan,
    plan_dim,
    split,
    unit_of,
)

SIZES = range(1, 26)
CHAINER_SIZES = range(1, 21)  # where each case calls chainer, fewer
RANKS = range(1, 5)
KERNELS = range(1, 6)
STRIDES = range(1, 4)
PADS = range(3)
DILATIONS = range(1, 3)
EXTENT_NOTE = re.compile(r"the smallest extent that works is (\d+)")


def padded(x, start, stop, fill):
    """Rows ``[start, stop)`` of ``x``, reading ``fill`` outside ``[0, len(x))``."""
    return np.array([x[i] if 0 <= i < len(x) else fill for i in range(start, stop)])


def correlate(x, w, stride, dilate):
    """A 1-D "valid" correlation of ``x`` with ``w`` dilated by ``dilate``."""
    extent = dilate * (len(w) - 1) + 1
    count = (len(x) - extent) // stride + 1 if len(x) >= extent else 0
    return np.array([sum(w[t] * x[j * stride + t * dilate] for t in range(len(w)))
                     for j in range(count)])


def global_correlate(x, w, window):
    """The layer over the whole signal: ``p`` zeros each side, ``s - 1`` more at the end
    under cover_all."""
    s, p = window.stride, window.pad
    extra = s - 1 if window.cover_all else 0
    return correlate(padded(x, -p, len(x) + p + extra, 0.0), w, s, window.dilate)


def deconvolve(x, w, stride, pad, dilate, outsize=None):
    """chainer's 1-D deconvolution of a signal ``x`` with a kernel ``w``."""
    y = F.deconvolution_nd(x.reshape(1, 1, -1), w.reshape(1, 1, -1), stride=stride, pad=pad,
                           outsize=None if outsize is None else (outsize,), dilate=dilate)
    return y.array.ravel()


def plans(window, n, parts, what="layer"):
    """Every rank's plan, or the GeometryError that ``plan_dim`` raised."""
    try:
        return [plan_dim(window, n, parts, r, what) for r in range(parts)]
    except GeometryError as error:
        return error


def local_rows(plan):
    """``(first, count)``: the extended tile's rows after trimming."""
    return plan.first, plan.ext - plan.trim_lo - plan.trim_hi


def exchange_problems(ps):
    """What is wrong with the rows the ranks of ``ps`` send one another."""
    found = []
    for r, plan in enumerate(ps):
        below = ps[r - 1] if r > 0 else None
        above = ps[r + 1] if r + 1 < len(ps) else None
        if plan.lo != (below.send_hi if below else 0):
            found.append(f"rank {r} receives lo={plan.lo}, rank {r - 1} sends it "
                         f"{below.send_hi if below else None}")
        if plan.hi != (above.send_lo if above else 0):
            found.append(f"rank {r} receives hi={plan.hi}, rank {r + 1} sends it "
                         f"{above.send_lo if above else None}")
        if below and plan.lo > below.own[1] - below.own[0]:
            found.append(f"rank {r} receives lo={plan.lo} from a tile of {below.own}")
        if above and plan.hi > above.own[1] - above.own[0]:
            found.append(f"rank {r} receives hi={plan.hi} from a tile of {above.own}")
    return found


def error_problems(error, window, n, parts, what):
    """What is wrong with a GeometryError's message and its suggested extent."""
    found = []
    if not str(error).startswith(f"{what}: "):
        found.append(f"the message does not name {what!r}: {error}")
    note = EXTENT_NOTE.search(str(error))
    if note is None:
        if "no extent up to 65536 works" not in str(error):
            found.append(f"the message suggests no extent: {error}")
        return found
    works = int(note.group(1))
    if works <= n or isinstance(plans(window, works, parts), GeometryError):
        found.append(f"the suggested extent {works} does not work: {error}")
    return found


def conv_problems(window, n, parts, x, w):
    """Rank by rank, the local correlation against the global one's slice."""
    what = f"conv{window}@{n}/{parts}"
    ps = plans(window, n, parts, what)
    if isinstance(ps, GeometryError):
        return error_problems(ps, window, n, parts, what)
    found = exchange_problems(ps)
    whole = global_correlate(x, w, window)
    if len(whole) != ps[0].m:
        found.append(f"m={ps[0].m}, the global correlation gives {len(whole)} rows")
    for r, plan in enumerate(ps):
        first, count = local_rows(plan)
        if (first, first + count) != plan.need:
            found.append(f"rank {r}'s tile holds [{first}, {first + count}), needs {plan.need}")
        part = correlate(padded(x, first, first + count, 0.0), w, window.stride, window.dilate)
        want = whole[plan.out[0]:plan.out[1]]
        if part.shape != want.shape or not np.allclose(part, want, rtol=1e-12, atol=1e-12):
            found.append(f"rank {r} {plan}: local {part}, global slice {want}")
    return [f"{window} n={n} P={parts}: {problem}" for problem in found]


def deconv_problems(window, n, parts, x, w):
    """Rank by rank, the local deconvolution, cropped, against the global one's slice."""
    what = f"deconv{window}@{n}/{parts}"
    ps = plans(window, n, parts, what)
    if isinstance(ps, GeometryError):
        return error_problems(ps, window, n, parts, what)
    found = exchange_problems(ps)
    s, p, d = window.stride, window.pad, window.dilate
    whole = deconvolve(x, w, s, p, d, window.outsize)
    if len(whole) != ps[0].m:
        found.append(f"m={ps[0].m}, chainer's deconvolution gives {len(whole)} rows")
    for r, plan in enumerate(ps):
        first, count = local_rows(plan)
        a, b = plan.need
        if (first, first + count) != (a, b):
            found.append(f"rank {r}'s tile holds [{first}, {first + count}), needs {plan.need}")
            continue
        part = deconvolve(padded(x, a, b, 0.0), w, s, 0, d)
        start, stop = window.produces(a, b)
        if stop - start != len(part):
            found.append(f"rank {r}: produces{(a, b)} = {(start, stop)}, the op gives "
                         f"{len(part)} rows")
        o0, o1 = plan.out
        if not start <= o0 < o1 <= start + len(part):
            found.append(f"rank {r}: outputs {plan.out} are not all among the local op's "
                         f"[{start}, {start + len(part)}) from inputs {plan.need}")
            continue
        part = part[o0 - start:o1 - start]
        if not np.allclose(part, whole[o0:o1], rtol=1e-12, atol=1e-12):
            found.append(f"rank {r} {plan}: local {part}, global slice {whole[o0:o1]}")
    return [f"{window} n={n} P={parts}: {problem}" for problem in found]


def assert_none(found):
    assert not found, f"{len(found)} problems, the first: " + "\n".join(found[:5])


@pytest.mark.parametrize("parts", range(1, 8))
def test_split_tiles_in_order_larger_parts_first(parts):
    for n in range(1, 41):
        tiles = [split(n, parts, r) for r in range(parts)]
        assert tiles[0][0] == 0 and tiles[-1][1] == n
        assert all(tiles[r][1] == tiles[r + 1][0] for r in range(parts - 1))
        sizes = [stop - start for start, stop in tiles]
        assert sizes == sorted(sizes, reverse=True)
        assert max(sizes) - min(sizes) <= 1


def test_out_size_is_chainers():
    for n, k, s, p, d in itertools.product(range(1, 12), KERNELS, STRIDES, PADS, DILATIONS):
        for cover_all in (False, True):
            want = conv.get_conv_outsize(n, k, s, p, cover_all=cover_all, d=d)
            if want >= 1:
                assert Window(k, s, p, d, cover_all).out_size(n) == want
            want = conv.get_deconv_outsize(n, k, s, p, cover_all=cover_all, d=d)
            if want >= 1:
                assert Window(k, s, p, d, cover_all, transposed=True).out_size(n) == want
    assert Window(3, 2, 1, transposed=True, outsize=8).out_size(4) == 8


@pytest.mark.parametrize("cover_all", [False, True])
def test_the_numpy_reference_is_chainers_convolution(cover_all):
    rng = np.random.default_rng(0)
    for n, k, s, p, d in itertools.product(range(1, 10), KERNELS, STRIDES, PADS, DILATIONS):
        if conv.get_conv_outsize(n, k, s, p, cover_all=cover_all, d=d) < 1:
            continue
        x, w = rng.standard_normal(n), rng.standard_normal(k)
        want = F.convolution_nd(x.reshape(1, 1, n), w.reshape(1, 1, k), stride=s, pad=p,
                                cover_all=cover_all, dilate=d).array.ravel()
        got = global_correlate(x, w, Window(k, s, p, d, cover_all))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cover_all", [False, True])
@pytest.mark.parametrize("stride", STRIDES)
@pytest.mark.parametrize("ksize", KERNELS)
def test_each_ranks_convolution_is_its_slice_of_the_global_one(ksize, stride, cover_all):
    rng = np.random.default_rng(ksize * 10 + stride)
    found = []
    for n, parts, p, d in itertools.product(SIZES, RANKS, PADS, DILATIONS):
        if conv.get_conv_outsize(n, ksize, stride, p, cover_all=cover_all, d=d) < 1:
            continue
        x, w = rng.standard_normal(n), rng.standard_normal(ksize)
        found += conv_problems(Window(ksize, stride, p, d, cover_all), n, parts, x, w)
    assert_none(found)


@pytest.mark.parametrize("cover_all", [False, True])
@pytest.mark.parametrize("ksize", KERNELS)
def test_each_ranks_max_pooling_is_its_slice_of_the_global_one(ksize, cover_all):
    # Padding rows are -inf; chainer pools the whole signal with its own padding.
    rng = np.random.default_rng(ksize)
    found = []
    for n, parts, s, p in itertools.product(CHAINER_SIZES, RANKS, STRIDES, PADS):
        window = Window(ksize, s, p, cover_all=cover_all)
        if window.out_size(n) < 1:
            continue
        what = f"pool{window}@{n}/{parts}"
        ps = plans(window, n, parts, what)
        if isinstance(ps, GeometryError):
            found += error_problems(ps, window, n, parts, what)
            continue
        x = rng.standard_normal(n)
        whole = F.max_pooling_nd(x.reshape(1, 1, n), ksize, s, p, cover_all).array.ravel()
        for plan in ps:
            first, count = local_rows(plan)
            rows = padded(x, first, first + count, -np.inf).reshape(1, 1, count)
            part = F.max_pooling_nd(rows, ksize, s, 0, cover_all=False).array.ravel()
            if not np.array_equal(part, whole[plan.out[0]:plan.out[1]]):
                found.append(f"{window} n={n} P={parts} {plan}: local {part}, global "
                             f"{whole[plan.out[0]:plan.out[1]]}")
    assert_none(found)


def deconv_outsizes(n, k, s, p, d):
    """The output sizes chainer's deconvolution accepts besides its own, each >= 1."""
    default = conv.get_deconv_outsize(n, k, s, p, d=d)
    return [size for size in range(max(1, default - s + 1), default + s)
            if size != default
            and conv.get_conv_outsize(size, k, s, p, d=d) <= n
            <= conv.get_conv_outsize(size, k, s, p, cover_all=True, d=d)]


@pytest.mark.parametrize("stride", STRIDES)
@pytest.mark.parametrize("ksize", KERNELS)
def test_each_ranks_deconvolution_is_its_slice_of_the_global_one(ksize, stride):
    rng = np.random.default_rng(ksize * 10 + stride)
    found = []
    for n, parts, p, d in itertools.product(CHAINER_SIZES, RANKS, PADS, DILATIONS):
        if conv.get_deconv_outsize(n, ksize, stride, p, d=d) < 1:
            continue
        x, w = rng.standard_normal(n), rng.standard_normal(ksize)
        found += deconv_problems(Window(ksize, stride, p, d, transposed=True), n, parts, x, w)
    assert_none(found)


@pytest.mark.parametrize("stride", [2, 3])
@pytest.mark.parametrize("ksize", KERNELS)
def test_a_deconvolution_of_a_given_outsize_is_sliced_alike(ksize, stride):
    rng = np.random.default_rng(ksize * 10 + stride)
    found = []
    for n, parts, p, d in itertools.product(range(1, 11), RANKS, PADS, DILATIONS):
        for size in deconv_outsizes(n, ksize, stride, p, d):
            x, w = rng.standard_normal(n), rng.standard_normal(ksize)
            window = Window(ksize, stride, p, d, transposed=True, outsize=size)
            # A fixed output size fits no other extent, so refusing one scans them all
            # (about a second); the refusals' messages are tested above.
            if _problem(window, n, parts) is None:
                found += deconv_problems(window, n, parts, x, w)
    assert_none(found)


def test_the_reference_example():
    ps = [plan_dim(Window(3, 2, 1), 10, 3, r) for r in range(3)]
    assert {plan.m for plan in ps} == {5}
    assert [plan.out for plan in ps] == [(0, 2), (2, 4), (4, 5)]
    assert [plan.own for plan in ps] == [(0, 4), (4, 7), (7, 10)]
    assert ps[1].need == (3, 8) and (ps[1].lo, ps[1].hi) == (1, 1)
    assert (ps[0].pad_lo, ps[0].pad_hi, ps[0].lo, ps[0].hi) == (1, 0, 0, 0)
    assert (ps[0].send_hi, ps[2].send_lo) == (1, 1)
    assert (ps[2].need, ps[2].lo, ps[2].pad_hi) == ((7, 10), 0, 0)


def test_a_stride_two_rank_trims_the_rows_it_does_not_need():
    ps = [plan_dim(Window(1, 2), 9, 2, r) for r in range(2)]
    # rank 1 owns [5, 9) and computes outputs [3, 5), reading rows 6 and 8 only.
    assert ps[1].own == (5, 9) and ps[1].out == (3, 5) and ps[1].need == (6, 9)
    assert (ps[1].trim_lo, ps[1].trim_hi, ps[1].lo, ps[1].first) == (1, 0, 0, 6)
    assert ps[0].send_hi == 0


def test_halo_plan_of_a_middle_rank_and_the_edges():
    ps = [halo_plan(10, 3, r, 2, 1) for r in range(3)]
    fields = [(p.own, p.need, p.lo, p.hi, p.pad_lo, p.pad_hi, p.send_lo, p.send_hi)
              for p in ps]
    assert fields == [((0, 4), (-2, 5), 0, 1, 2, 0, 0, 2),
                      ((4, 7), (2, 8), 2, 1, 0, 0, 1, 2),
                      ((7, 10), (5, 11), 2, 0, 0, 1, 1, 0)]
    assert not exchange_problems(ps)
    assert all(local_rows(p) == (p.need[0], p.need[1] - p.need[0]) for p in ps)


def test_a_halo_wider_than_a_neighbours_tile_says_what_works():
    with pytest.raises(GeometryError, match="wider than rank 1's tile of 3 rows.*smallest extent"):
        halo_plan(10, 3, 0, 4, 0)
    with pytest.raises(GeometryError, match="2 rows, fewer than the 3 ranks"):
        halo_plan(2, 3, 0, 1, 1)


def _halo_fails(n, parts, lo, hi):
    try:
        [halo_plan(n, parts, r, lo, hi) for r in range(parts)]
    except GeometryError:
        return True
    return False


def test_halo_plans_suggested_extent_is_the_smallest_that_works():
    # It suggested parts * max(lo, hi): 4 for n=2, P=2, lo=2, where 3 already works.
    found = []
    for n, parts, lo, hi in itertools.product(range(1, 20), range(2, 5), range(5), range(5)):
        try:
            halo_plan(n, parts, 0, lo, hi)
        except GeometryError as error:
            note = EXTENT_NOTE.search(str(error))
            if note is None:
                continue
            works = int(note.group(1))
            fits = [size for size in range(n, works + 1)
                    if not _halo_fails(size, parts, lo, hi)]
            if fits[:1] != [works]:
                found.append(f"halo_plan({n}, {parts}, r, {lo}, {hi}) suggests {works}, "
                             f"the smallest that works is {fits[:1]}")
    assert_none(found)


def test_plan_dim_errors_name_the_layer_and_the_reason():
    with pytest.raises(GeometryError, match=r"^conv2: the output has 2 rows, fewer than the 3"):
        plan_dim(Window(3), 4, 3, 0, "conv2")
    with pytest.raises(GeometryError, match=r"^up1: the input has 2 rows, fewer than the 3"):
        plan_dim(Window(2, 2, transposed=True), 2, 3, 0, "up1")
    with pytest.raises(GeometryError, match=r"^conv1: rank 0 needs 2 rows from rank 1, which "
                                            r"holds only 1.*smallest extent that works is 7$"):
        plan_dim(Window(5, pad=2), 4, 4, 0, "conv1")
    assert plan_dim(Window(5, pad=2), 7, 4, 3).lo == 2
    with pytest.raises(GeometryError, match="smallest extent that works is 7"):
        plan_dim(Window(5, pad=2), 6, 4, 0)


def test_a_split_of_the_width_is_counted_in_columns():
    # Regression: a width too narrow for its ranks was reported in "rows".
    from mnpar.spatial.operations._window_op import plans_for

    window = Window(3, 1, 1)
    with pytest.raises(GeometryError, match=r"conv: the input has 1 columns, fewer than the 2 "
                                            r"ranks"):
        plans_for((window, window), (8, 1), (1, 2), (0, 0), "conv")
    with pytest.raises(GeometryError, match=r"conv: the input has 1 rows, fewer than the 2"):
        plans_for((window, window), (1, 8), (2, 1), (0, 0), "conv")
    with pytest.raises(GeometryError, match=r"needs 3 columns from rank 1, which holds only 2"):
        plans_for((Window(7, 1, 3),) * 2, (9, 6), (1, 3), (0, 2), "conv")
    with pytest.raises(GeometryError, match=r"wider than rank 1's tile of 3 slices"):
        halo_plan(10, 3, 0, 4, 0, unit_of(0, 3))
    assert [unit_of(a, 3) for a in range(3)] == ["slices", "rows", "columns"]
    assert unit_of(0, 1) == "positions" and unit_of(3, 4) == "indices along axis 3"
