"""A model in one process and its converted twin on tiles: what the spatial tests compare.

``same_as_one_process(grid, make, x)`` builds ``make()`` twice from one seed,
converts one, runs both forward (the same seed before each, so lazily drawn
weights agree) and backward with the same random output weights, and
compares outputs, the input's gradient and every parameter's gradient (a
sharded parameter's with its part of the one-process gradient).
"""
from typing import Any, Callable, Optional, Tuple

import chainer
import chainer.functions as F
import numpy as np
import pytest

import mnpar

S = mnpar.spatial


class Body(chainer.Chain):
    """Child links ``l0, l1...`` and a forward ``fn(self, x)``."""

    def __init__(self, fn: Callable[..., Any], *links: chainer.Link) -> None:
        super().__init__()
        self.fn = fn
        with self.init_scope():
            for i, link in enumerate(links):
                setattr(self, f"l{i}", link)

    def forward(self, x: Any) -> Any:
        return self.fn(self, x)


class Scalar(chainer.Link):
    """A learned factor, broadcast to whatever it multiplies (a parameter meeting a tile
    through ``F.broadcast_to``)."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.a = chainer.Parameter(np.full((1, 1, 1, 1), 1.5))

    def forward(self, h: Any) -> Any:
        return h * F.broadcast_to(F.cast(self.a, h.dtype), h.shape)


def twins(make: Callable[[], chainer.Link], dtype: Any = np.float64
          ) -> Tuple[chainer.Link, chainer.Link]:
    models = []
    for _ in range(2):
        np.random.seed(0)
        with chainer.using_config("dtype", dtype):
            models.append(make())
    return models[0], models[1]


def close(actual: Any, expected: Any, tol: float, what: str) -> None:
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    scale = max(1.0, float(np.abs(expected).max(initial=0)))
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale, err_msg=what)


def same_as_one_process(grid: Any, make: Callable[[], chainer.Link], x: Any, *,
                        tiled: Optional[bool] = None, tol: float = 1e-10,
                        dtype: Any = np.float64) -> Tuple[chainer.Link, chainer.Link]:
    """Asserts that ``make()`` converted on ``grid`` computes what it computes in one process.

    ``tiled``: whether the output is a tile (else the whole result on every
    rank); None: a tile where its shape is not the whole output's.
    """
    ref, ours = twins(make, dtype)
    S.convert(ours, grid)
    x = x.astype(dtype)
    xv, tv = chainer.Variable(x), chainer.Variable(grid.tile(x))
    with chainer.using_config("dtype", dtype):
        np.random.seed(5)
        y = ref(xv)
        np.random.seed(5)
        yt = ours(tv)
    tiled = yt.shape != y.shape if tiled is None else tiled
    w = np.random.RandomState(2).standard_normal(y.shape).astype(dtype)
    ref.cleargrads()
    ours.cleargrads()
    F.sum(y * w).backward()
    expected = tile_of(grid, y.array, x.ndim - 2) if tiled else y.array
    try:
        close(yt.array, expected, tol, "the output")
        failures = []
    except AssertionError as e:
        failures = [str(e)]
    agree(grid, failures)
    if tiled:
        loss = S.sum_over_grid(F.sum(yt * tile_of(grid, w, x.ndim - 2)), grid)
    else:
        loss = F.sum(yt * w)
    loss.backward()
    failures = []
    mine = dict(ours.namedparams())
    checks = [("the input's gradient", tv.grad, grid.tile(xv.grad))]
    for name, p in sorted(ref.namedparams()):
        q = mine[name]
        expected = p.grad
        if S.shard_grid(q) is not None:
            expected = part_of(ours, name, expected)
        checks.append((f"{name}'s gradient", q.grad, expected))
    for what, actual, expected in checks:
        try:
            close(actual, expected, tol, what)
        except AssertionError as e:
            failures.append(str(e))
    agree(grid, failures)
    return ref, ours


def tile_of(grid: Any, a: Any, spatial: int) -> Any:
    """This rank's tile of ``a``, whose last ``spatial`` axes are the image's."""
    return a[(Ellipsis,) + grid.tile_slices(a.shape[a.ndim - spatial:])]


def converted(grid: Any, make: Callable[[], chainer.Link], dtype: Any = np.float64
              ) -> chainer.Link:
    """``make()`` in ``dtype`` from seed 0 (the same on every rank), converted."""
    np.random.seed(0)
    with chainer.using_config("dtype", dtype):
        return S.convert(make(), grid)


def agree(grid: Any, failures: list) -> None:
    """Fails on every rank of the grid if any rank has ``failures`` (none left waiting)."""
    every = grid.mpi.allgather(failures)
    bad = [(rank, f) for rank, fs in enumerate(every) for f in fs]
    if bad:
        raise AssertionError(f"grid rank {bad[0][0]}: {bad[0][1]}")


def part_of(model: chainer.Link, name: str, whole: Any) -> Any:
    """This rank's part of a sharded parameter's whole array."""
    link = dict(model.namedlinks())[name.rsplit("/", 1)[0] or "/"]
    if isinstance(link, S.LocalConvolution2D):
        rows, cols = link.grid.tile_slices(tuple(int(v) for v in link.shard[2:4]))[:2]
        return whole[:, rows, cols]
    block = tuple(int(v) for v in link.shard[2:] if v >= 0)
    from mnpar.spatial._marks import Flat

    return whole[:, Flat(link.grid, block, 1).features()]


def on(shape, ranks):
    """A grid shape as a test parameter, skipped where the run has fewer than ``ranks``."""
    return pytest.param(shape, id="x".join(map(str, shape)), marks=pytest.mark.mpi(min_size=ranks))


# Every grid of up to 4 ranks, each skipped where the run has fewer ranks.
GRIDS = [on((1, 1), 1), on((1, 2), 2), on((2, 1), 2), on((1, 3), 3), on((3, 1), 3),
         on((2, 2), 4)]
