"""Which rows each rank owns, needs and sends: the geometry of spatial layers.

Pure functions of sizes and ranks, with no MPI and no arrays, so every rank
computes its own plan and its neighbours' alike and the rules are tested in
one process. One dimension at a time (the grid splits each spatial axis on
its own); ``n`` input rows, ``P`` ranks, rank ``r``.

Every activation is tiled by one balanced rule, ``split``: rank r holds
``n // P`` rows, plus one if ``r < n % P``. A layer's output tiles are the
next layer's input tiles, so a rank owning outputs ``[o0, o1)`` and inputs
``[i0, i1)`` builds its *extended tile* along the axis as::

    pad_lo | lo (from rank r-1) | own rows [i0, i1) | hi (from rank r+1) | pad_hi
             ^ trim_lo own rows dropped here          trim_hi dropped here ^

Padding rows (outside ``[0, n)``) are made locally with the layer's fill
(0, or -inf for max pooling) and never sent; the local op then runs with
padding 0, so chainer's symmetric padding and ``cover_all`` never apply to a
tile. Own rows the rank does not need (a negative halo, as with stride 2)
are trimmed; their gradient is zero.

A transposed window (deconvolution) maps input row ``i`` onto outputs
``s*i - p + t*d`` for ``t < k``; the rank takes every input row that reaches
one of its outputs (padded with zero rows until the op's outputs span its
own), runs the op with padding 0 and crops its outputs.
"""
from typing import NamedTuple, Optional, Tuple

from .._errors import SpatialError


def split(n: int, parts: int, index: int) -> Tuple[int, int]:
    """The rows ``[start, stop)`` that part ``index`` of ``parts`` holds of ``n`` rows."""
    q, e = divmod(n, parts)
    start = index * q + min(index, e)
    return start, start + q + (1 if index < e else 0)


class Window(NamedTuple):
    """A sliding window along one axis, in chainer's terms."""

    ksize: int
    stride: int = 1
    pad: int = 0
    dilate: int = 1
    cover_all: bool = False
    transposed: bool = False
    outsize: Optional[int] = None  # a transposed window's output size, if given

    @property
    def extent(self) -> int:
        """Rows one window spans: ``dilate * (ksize - 1) + 1``."""
        return self.dilate * (self.ksize - 1) + 1

    def out_size(self, n: int) -> int:
        """The output extent for ``n`` input rows, as chainer computes it."""
        k, s, p = self.extent, self.stride, self.pad
        if self.transposed:
            if self.outsize is not None:
                return self.outsize
            return s * (n - 1) + k - 2 * p - ((s - 1) if self.cover_all else 0)
        if self.cover_all:
            return (n + 2 * p - k + s - 1) // s + 1
        return (n + 2 * p - k) // s + 1

    def needs(self, o0: int, o1: int, n: int) -> Tuple[int, int]:
        """Input rows ``[a, b)`` that outputs ``[o0, o1)`` read (``o1 > o0``).

        Rows outside ``[0, n)`` are padding (a transposed window's are zeros,
        which add nothing: they only make the op's outputs reach ``[o0, o1)``).
        """
        k, s, p = self.extent, self.stride, self.pad
        if not self.transposed:
            return s * o0 - p, s * (o1 - 1) - p + k
        # every input row that reaches an output, and enough rows that the op's
        # outputs cover [o0, o1) (outputs no input reaches hold the bias alone)
        a = min(-((k - 1 - o0 - p) // s), (o0 + p) // s)
        b = max((o1 - 1 + p) // s + 1, -((k - o1 - p) // s) + 1)
        return a, b

    def produces(self, a: int, b: int) -> Tuple[int, int]:
        """Global outputs ``[first, stop)`` of the op on input rows ``[a, b)``, padding 0."""
        k, s, p = self.extent, self.stride, self.pad
        if self.transposed:
            return s * a - p, s * (b - 1) - p + k
        return (a + p) // s, (a + p) // s + (b - a - k) // s + 1


class DimPlan(NamedTuple):
    """One rank's rows along one axis for one layer (see the module docstring)."""

    n: int            # input extent
    m: int            # output extent
    own: Tuple[int, int]
    out: Tuple[int, int]
    need: Tuple[int, int]    # input rows read, [a, b), may leave [0, n)
    lo: int           # rows received from rank r-1
    hi: int           # rows received from rank r+1
    pad_lo: int
    pad_hi: int
    trim_lo: int
    trim_hi: int
    send_lo: int      # own rows sent to rank r-1 (its ``hi``)
    send_hi: int      # own rows sent to rank r+1 (its ``lo``)

    @property
    def ext(self) -> int:
        """Rows of the extended tile before trimming."""
        return self.pad_lo + self.lo + (self.own[1] - self.own[0]) + self.hi + self.pad_hi

    @property
    def first(self) -> int:
        """Global index of the extended tile's first row after trimming."""
        return self.own[0] - self.lo - self.pad_lo + self.trim_lo


class GeometryError(SpatialError):
    """A layer's geometry that the grid cannot run (the message says why and what works)."""


def unit_of(axis: int, ndim: int) -> str:
    """What messages call the indices along spatial ``axis`` of ``ndim``: an image's rows and
    columns, a volume's slices, rows and columns."""
    names = {1: ("positions",), 2: ("rows", "columns"), 3: ("slices", "rows", "columns")}
    return names[ndim][axis] if ndim in names else f"indices along axis {axis}"


def _reach(window: Window, n: int, parts: int, r: int) -> Tuple[int, int, int, int, int, int]:
    """``(lo, hi, pad_lo, pad_hi, trim_lo, trim_hi)`` of rank ``r``, unchecked."""
    i0, i1 = split(n, parts, r)
    o0, o1 = split(window.out_size(n), parts, r)
    a, b = window.needs(o0, o1, n)
    lo = max(0, i0 - max(a, 0))
    hi = max(0, min(b, n) - i1)
    return lo, hi, max(0, -a), max(0, b - n), max(0, a - i0), max(0, i1 - b)


def _problem(window: Window, n: int, parts: int, unit: str = "rows") -> Optional[str]:
    """Why ``window`` cannot run on ``n`` rows split ``parts`` ways, or None; ``unit``
    names the rows in the message (``unit_of``)."""
    m = window.out_size(n)
    if n < parts:
        return f"the input has {n} {unit}, fewer than the {parts} ranks that split it"
    if m < parts:
        return f"the output has {m} {unit}, fewer than the {parts} ranks that split it"
    for r in range(parts):
        i0, i1 = split(n, parts, r)
        lo, hi, _, _, trim_lo, trim_hi = _reach(window, n, parts, r)
        if trim_lo + trim_hi >= i1 - i0:
            return f"rank {r} would need none of its own {unit} {i0}..{i1 - 1}"
        if r > 0 and lo > i0 - split(n, parts, r - 1)[0]:
            return (f"rank {r} needs {lo} {unit} from rank {r - 1}, which holds only "
                    f"{i0 - split(n, parts, r - 1)[0]}")
        if r + 1 < parts and hi > split(n, parts, r + 1)[1] - i1:
            return (f"rank {r} needs {hi} {unit} from rank {r + 1}, which holds only "
                    f"{split(n, parts, r + 1)[1] - i1}")
    return None


def smallest_working(window: Window, n: int, parts: int) -> Optional[int]:
    """The smallest extent ``>= n`` that ``window`` can run on when split ``parts`` ways.

    None if none up to a bound past which tiles only grow (each holds at least
    the window's span and stride twice over), or if the window's output size
    is fixed (a transposed window's ``outsize``), which no extent changes.
    """
    if window.outsize is not None:
        return None
    limit = max(n, parts) + 2 * parts * (window.extent + window.stride + 2 * window.pad) + 1
    for size in range(max(n, parts), limit):
        if _problem(window, size, parts) is None:
            return size
    return None


def plan_dim(window: Window, n: int, parts: int, r: int, what: str = "layer",
             unit: str = "rows") -> DimPlan:
    """Rank ``r``'s plan along one axis, whose indices ``unit`` names (``unit_of``).

    Raises:
        GeometryError: the tiles are too small for the window (a halo wider
            than a neighbour's tile, a rank with no output rows); the message
            names ``what``, the sizes, and the smallest extent that works.
    """
    problem = _problem(window, n, parts, unit)
    if problem is not None:
        works = smallest_working(window, n, parts)
        hint = (f"; the smallest extent that works is {works}" if works is not None
                else "; no larger extent works either")
        raise GeometryError(f"{what}: {problem} (extent {n} split {parts} ways, kernel "
                            f"{window.ksize}, stride {window.stride}, pad {window.pad}, "
                            f"dilate {window.dilate}){hint}")
    lo, hi, pad_lo, pad_hi, trim_lo, trim_hi = _reach(window, n, parts, r)
    send_lo = _reach(window, n, parts, r - 1)[1] if r > 0 else 0
    send_hi = _reach(window, n, parts, r + 1)[0] if r + 1 < parts else 0
    m = window.out_size(n)
    o0, o1 = split(m, parts, r)
    return DimPlan(n, m, split(n, parts, r), (o0, o1), window.needs(o0, o1, n), lo, hi,
                   pad_lo, pad_hi, trim_lo, trim_hi, send_lo, send_hi)


def _too_wide(n: int, parts: int, lo: int, hi: int) -> Optional[int]:
    """The first rank whose tile cannot give a neighbour its ``lo``/``hi`` halo, or None."""
    for q in range(parts):
        size = split(n, parts, q)[1] - split(n, parts, q)[0]
        if (q + 1 < parts and lo > size) or (q > 0 and hi > size):
            return q
    return None


def halo_plan(n: int, parts: int, r: int, lo: int, hi: int, unit: str = "rows") -> DimPlan:
    """The plan of a plain halo exchange: ``lo`` rows below and ``hi`` above each tile,
    filled at the image's edges (``halo_exchange``); ``unit`` names the rows in messages."""
    own = split(n, parts, r)
    if n < parts:
        raise GeometryError(f"halo_exchange: the input has {n} {unit}, fewer than the {parts} "
                            "ranks that split it")
    wide = _too_wide(n, parts, lo, hi)
    if wide is not None:
        smallest = next(size for size in range(n + 1, n + parts * max(lo, hi) + 1)
                        if _too_wide(size, parts, lo, hi) is None)
        start, stop = split(n, parts, wide)
        raise GeometryError(f"halo_exchange: a halo of {max(lo, hi)} {unit} is wider than "
                            f"rank {wide}'s tile of {stop - start} {unit} (extent {n} split "
                            f"{parts} ways); the smallest extent that works is {smallest}")
    r_lo = lo if r > 0 else 0
    r_hi = hi if r + 1 < parts else 0
    return DimPlan(n, n, own, own, (own[0] - lo, own[1] + hi), r_lo, r_hi, lo - r_lo,
                   hi - r_hi, 0, 0, hi if r > 0 else 0, lo if r + 1 < parts else 0)
