"""A stack of 3x3 convolutions split over a 1x2 grid, against one process and the peers.

    mpiexec -n 2 python benchmarks/bench_spatial.py [--size 512] [--channels 32]
        [--layers 4] [--batch 2] [--rounds 3] [--steps 1] [--profile] [--gpu]

The model: ``--layers`` convolutions of ``--channels`` to ``--channels``
channels, 3x3, pad 1, with bias, each followed by a ReLU, on a batch of
``--batch`` images of ``--size`` x ``--size``. A timed step is forward and
backward from a fixed output gradient (and the gradient reduction where a
variant needs one); no optimizer update, which is the same for all. Every
variant computes the same gradients (up to rounding), but the last.

=============================  ============================================
variant                        what each rank does
=============================  ============================================
one process                    rank 0 alone: ``model(x)`` on the whole
                               batch; rank 1 sleeps in a polled
                               ``Ibarrier``
one process, image by image    the same, one image at a time, gradients
                               accumulated
spatial 1x2, overlap on        its half of every image (left or right
                               columns), ``mnpar.spatial.Convolution2D``,
                               interior while the halo travels; weight
                               gradients summed over the grid inside the
                               backward pass
spatial 1x2, overlap off       the same, computing after the halo landed
spatial 1x2, overlap on,       overlap on, one image's tile at a time
image by image
data parallel                  ``batch / 2`` whole images, then mnpar's
                               ``multi_node_mean_grad`` (default
                               communicator)
channel-parallel (ChainerMN)   ChainerMN's ``parallel_convolution``
                               example's approach: every rank holds the
                               whole batch, convolves its half of the
                               input channels to half of the output
                               channels, then ``chainermn.functions.
                               allgather`` and a concat
=============================  ============================================

The channel-parallel variant is a *grouped* convolution (2 groups): it has
a quarter of the dense layer's weights and multiply-adds, so its figure is
that of a different, cheaper model, not of the dense stack the others run.

Why two one-process runs. Chainer's CPU convolution multiplies its im2col
buffer ``(N, C, kh, kw, H, W)`` through ``numpy.tensordot``, which for
``N > 1`` first copies the buffer transposed; for ``N == 1`` the axes merge
and BLAS reads it in place. At power-of-two ``H x W`` the copy strides by a
power of two and thrashes the caches, so ``model(x)`` on 2 x 512 x 512
takes more than twice as long as the same two images one after the other
(docs/benchmarks_history.rst, "bench_spatial, 2026-11-24"). A speed-up over
the batched run would be mostly that artefact, so the baseline ("vs one
process", and the last line) is the *faster* of the two one-process runs,
for time and for memory alike.

Fairness. Every rank runs one BLAS thread (pinned with threadpoolctl,
whatever the core count), and so does the one process. The one process
runs on rank 0 while rank 1 waits in a sleeping poll (1 ms), not in MPI's
spinning barrier, so that the idle rank leaves its core to whatever else
runs there; a subprocess would have forked an MPI rank. The variants run in
interleaved rounds (each round measures every variant once), so all see
the same machine; a variant's time is its slowest rank's, and the table
gives the median round with the fastest and slowest. Data parallelism
(independent images, then a small allreduce) shows what two ranks can gain on
the machine at that moment.

The allocator. A 300 MB im2col buffer is a fresh ``mmap`` from glibc each
time (above its mmap threshold), and touching it page-faults every page:
with the default allocator much of the run is system time, and more of it
in the variants with the largest buffers (the one process), which makes the
ratios superlinear (docs/benchmarks_history.rst, "bench_spatial,
2026-11-24"). ``make bench`` therefore runs this script with
``MALLOC_MMAP_THRESHOLD_=2000000000`` and
``MALLOC_TRIM_THRESHOLD_=4000000000`` (every variant alike; the header line
says which), so freed buffers are reused and the figures compare
computation; docs/benchmarks.rst gives both.

Peak memory is measured in an untimed step per variant (which also warms
it up), with ``tracemalloc`` (NumPy's buffers are traced): everything the
step allocates from a fresh copy of its input and output gradient on, and
the most any rank of the variant reaches. MPI's own buffers are not traced;
the halos are a few rows. The last line uses overlap on (the default) for
the memory ratio; ``spatial 1x2`` is what scripts read::

    spatial 1x2: S.SSx one process (overlap on), T.TTx (off), peak memory per rank M.MMx

An instrumented step after the rounds splits each spatial rank's time into
halo waits (``Exchange.finish``), the per-layer shape ``Allgather``, the
weight-gradient allreduce and the rest (computation, packing, Python); the
collectives' time is mostly waiting for the other rank to get there.
``--profile`` also prints rank 0's cProfile of a step of the image-by-image
one process and of the spatial runs with overlap.

``--gpu`` runs every variant on GPUs (``_common.gpu_device``: a GPU per rank,
shared where the ranks outnumber them; halos and sums go through host
memory), waits for the GPU before each clock read and measures the peak of
cupy's memory pool; the channel-parallel variant is left out (ChainerMN's
``allgather`` of cupy arrays needs a CUDA-aware MPI). Images large enough
that chainer's batched one process fails on a GPU would end this script at
that variant; ``examples/spatial/large_images.py`` runs that case.
"""
import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import time
import tracemalloc
import warnings
from typing import Any, Callable, List, Tuple

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_info, threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import GpuPeak, gpu_device, synchronize, table  # noqa: E402

import mnpar  # noqa: E402
import mnpar.spatial  # noqa: E402
from mnpar.spatial.traffic import _grid, _halo  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)  # ChainerMN's experimental notes
warnings.filterwarnings("ignore", category=UserWarning)
import chainermn  # noqa: E402  (after the filters: it warns on import)
import chainermn.functions  # noqa: E402

MiB = 1 << 20
Step = Callable[[Any, Any], None]


def stack(conv: Callable[[], chainer.Link], layers: int) -> chainer.Sequential:
    """``layers`` times conv then ReLU."""
    parts: List[Any] = []
    for _ in range(layers):
        parts += [conv(), F.relu]
    return chainer.Sequential(*parts)


class ChannelParallelConvolution2D(L.Convolution2D):
    """ChainerMN's parallel_convolution example's layer: half the channels in, allgather out."""

    def __init__(self, comm: Any, channels: int, **kwargs: Any) -> None:
        self.comm = comm
        self.mine = list(range(comm.rank, channels, comm.size))
        super().__init__(len(self.mine), len(self.mine), 3, **kwargs)

    def forward(self, x: Any) -> chainer.Variable:
        y = super().forward(x[:, self.mine])
        return F.concat(chainermn.functions.allgather(self.comm, y), axis=1)


def one_step(model: chainer.Link, after: Callable[[], None] = lambda: None) -> Step:
    """Forward, backward from ``gy``, then ``after`` (a gradient reduction)."""
    def step(x: Any, gy: Any) -> None:
        model.cleargrads()
        y = model(x)
        y.grad = gy
        y.backward()
        after()
    return step


def image_by_image(model: chainer.Link) -> Step:
    """``one_step`` on each image in turn, the gradients accumulated: the same gradients."""
    def step(x: Any, gy: Any) -> None:
        model.cleargrads()
        for i in range(len(x)):
            y = model(x[i:i + 1])
            y.grad = gy[i:i + 1]
            y.backward()
    return step


def idle_wait(world: MPI.Comm) -> None:
    """A barrier that sleeps between polls, leaving the core to others."""
    req = world.Ibarrier()
    while not req.Test():
        time.sleep(1e-3)


class Variant:
    """A way to run the step: on which ranks, on which inputs."""

    def __init__(self, name: str, step: Step, inputs: Tuple[Any, Any], active: bool,
                 note: str = "", device: Any = None) -> None:
        self.name, self.step, self.inputs = name, step, inputs
        self.active, self.note, self.device = active, note, device
        self.times: List[float] = []
        self.peak = 0

    def run(self, world: MPI.Comm, x: Any = None, gy: Any = None) -> float:
        """Seconds of one step on this rank (inf where inactive); ranks start together."""
        world.Barrier()
        if not self.active:
            idle_wait(world)
            return float("inf")
        synchronize(self.device)
        start = time.perf_counter()
        self.step(*(self.inputs if x is None else (x, gy)))
        synchronize(self.device)
        seconds = time.perf_counter() - start
        idle_wait(world)
        return seconds

    def measure(self, world: MPI.Comm, steps: int) -> None:
        mine = [self.run(world) for _ in range(steps)]
        mine = [t for t in mine if t != float("inf")]
        worst = world.allreduce(sum(mine) / len(mine) if mine else 0.0, op=MPI.MAX)
        self.times.append(worst)

    def measure_memory(self, world: MPI.Comm) -> None:
        """Peak traced bytes of one step, its fresh input and output gradient included."""
        gc.collect()
        peak = 0
        if self.active and self.device is not None and self.device.xp is not np:
            with GpuPeak() as gpu:
                x, gy = (a.copy() for a in self.inputs)
                self.run(world, x, gy)
                del x, gy
            peak = gpu.peak
        elif self.active:
            tracemalloc.start()
            x, gy = (a.copy() for a in self.inputs)
            self.run(world, x, gy)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            del x, gy
        else:
            self.run(world)
        self.peak = world.allreduce(peak, op=MPI.MAX)


class Split:
    """Wall time inside the spatial package's waits, by kind, during one step."""

    PATCHES = ((_halo.Exchange, "finish", "halo wait"),
               (_grid.SpatialGrid, "global_shape", "shape allgather"),
               (_grid.SpatialGrid, "allreduce_sum", "weight-grad allreduce"))

    def __init__(self) -> None:
        self.spent = {label: 0.0 for _, _, label in self.PATCHES}
        self.saved: List[Tuple[Any, str, Any]] = []

    def __enter__(self) -> "Split":
        for owner, name, label in self.PATCHES:
            original = getattr(owner, name)
            self.saved.append((owner, name, original))
            setattr(owner, name, self._timed(original, label))
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, original in self.saved:
            setattr(owner, name, original)

    def _timed(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[label] += time.perf_counter() - start
        return wrapper


def machine() -> str:
    from _mnpar_compat._openblas import cpu

    info = cpu() or {}
    pools = [f"{p['internal_api']} {p['version']} {p['architecture']}, "
             f"{p['num_threads']} thread(s)"
             for p in threadpool_info() if p["user_api"] == "blas" and "numpy" in p["filepath"]]
    return (f"{info.get('model name', 'an unknown CPU')} (family {info.get('cpu family')} "
            f"model {info.get('model')}), {os.cpu_count()} cores; numpy {np.__version__}'s BLAS: "
            f"{'; '.join(pools) or 'unknown'}; load average "
            f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}; malloc: "
            f"{os.environ.get('MALLOC_MMAP_THRESHOLD_', 'default')} mmap threshold")


def build(args: argparse.Namespace, world: MPI.Comm,
          device: Any) -> Tuple[List[Variant], Any]:
    size, rank = world.size, world.rank
    c = args.channels
    rng = np.random.RandomState(0)
    x = rng.standard_normal((args.batch, c, args.size, args.size)).astype(np.float32)
    gy = rng.standard_normal(x.shape).astype(np.float32)
    np.random.seed(1)
    single = stack(lambda: L.Convolution2D(c, c, 3, pad=1), args.layers)
    comm = mnpar.create_communicator()
    grid = mnpar.spatial.SpatialGrid(comm, (1, size))
    cmn = chainermn.create_communicator("naive")

    def on_device(*arrays: Any) -> Tuple[Any, ...]:
        return tuple(device.send(np.ascontiguousarray(a)) for a in arrays)

    def spatial_stack(overlap: bool) -> chainer.Sequential:
        model = stack(lambda: mnpar.spatial.Convolution2D(c, c, 3, pad=1, grid=grid,
                                                          overlap=overlap), args.layers)
        model.copyparams(single)
        return model.to_device(device)

    tiles = on_device(grid.tile(x), grid.tile(gy))
    on, off = spatial_stack(True), spatial_stack(False)
    dp = stack(lambda: L.Convolution2D(c, c, 3, pad=1), args.layers)
    dp.copyparams(single)
    dp.to_device(device)
    single.to_device(device)
    whole = on_device(x, gy)
    variants = [Variant("one process", one_step(single), whole, rank == 0),
                Variant("one process, image by image", image_by_image(single), whole,
                        rank == 0)]
    variants += [Variant(f"spatial 1x{size}, overlap on", one_step(on), tiles, True),
                 Variant(f"spatial 1x{size}, overlap off", one_step(off), tiles, True),
                 Variant(f"spatial 1x{size}, overlap on, image by image", image_by_image(on),
                         tiles, True)]
    per = args.batch // size
    variants.append(Variant(f"data parallel, {per} image(s) per rank",
                            one_step(dp, lambda: comm.multi_node_mean_grad(dp)),
                            on_device(x[rank * per:(rank + 1) * per],
                                      gy[rank * per:(rank + 1) * per]), True))
    if not args.gpu:
        cp = stack(lambda: ChannelParallelConvolution2D(cmn, c, pad=1), args.layers)
        variants.append(Variant("channel-parallel (ChainerMN)", one_step(cp), (x, gy), True,
                                "grouped conv: 1/4 of the dense FLOPs"))
    for v in variants:
        v.device = device
    return variants, grid


def split_line(world: MPI.Comm, variant: Variant) -> List[str]:
    world.Barrier()
    with Split() as split:
        start = time.perf_counter()
        variant.step(*variant.inputs)
        synchronize(variant.device)
        total = time.perf_counter() - start
    rows = world.gather((world.rank, total, split.spent), root=0)
    if rows is None:  # not rank 0
        return []
    lines = []
    for rank, total, spent in rows:
        rest = total - sum(spent.values())
        parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in spent.items())
        lines.append(f"  {variant.name}, rank {rank}: {total * 1e3:.0f} ms = {parts}, "
                     f"compute and the rest {rest * 1e3:.0f}")
    return lines


def profile(world: MPI.Comm, variant: Variant, lines: int = 12) -> None:
    """Rank 0's cProfile of one step of ``variant``, by own time."""
    prof = cProfile.Profile()
    world.Barrier()
    if variant.active:
        prof.enable()
        variant.step(*variant.inputs)
        prof.disable()
    idle_wait(world)
    if world.rank == 0:
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("tottime").print_stats(lines)
        body = out.getvalue()
        print(f"cProfile of one step of {variant.name!r} on rank 0, by own time:")
        print(body[body.index("   ncalls"):].rstrip() + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=512, help="image height and width")
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2, help="global batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1, help="steps per variant per round")
    parser.add_argument("--profile", action="store_true",
                        help="also print rank 0's cProfile of the image-by-image one process "
                        "and spatial steps")
    parser.add_argument("--gpu", action="store_true",
                        help="run on GPUs (needs cupy): a GPU per rank, shared where fewer")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        raise SystemExit("run with mpiexec -n 2")
    if args.batch % world.size or args.channels % world.size:
        raise SystemExit(f"--batch {args.batch} and --channels {args.channels} must be "
                         f"multiples of the {world.size} ranks")
    device = chainer.get_device("@numpy")
    if args.gpu:
        node = world.Split_type(MPI.COMM_TYPE_SHARED)  # this rank's place on its node
        device = gpu_device(node.rank)
        node.Free()
    variants, grid = build(args, world, device)
    limits = threadpool_limits(limits=1, user_api="blas")  # after mnpar's own limit
    if world.rank == 0:
        print(machine() + (f"; on GPUs, rank 0 {device}, peak MiB: cupy's memory pool"
                           if args.gpu else ""))
    for v in variants:
        v.measure_memory(world)  # also the warm-up: caches, MPI connections
    for _ in range(args.rounds):
        for v in variants:
            v.measure(world, args.steps)
    spatial = variants[2:5]
    splits = [line for v in spatial for line in split_line(world, v)]
    if args.profile:
        for v in variants[1], spatial[0], spatial[2]:
            profile(world, v)
    limits.restore_original_limits()
    if world.rank != 0:
        return
    base = min(variants[:2], key=lambda v: statistics.median(v.times))
    t0, m0 = statistics.median(base.times), base.peak
    rows = []
    for v in variants:
        t = statistics.median(v.times)
        spread = f"{min(v.times) * 1e3:.0f}-{max(v.times) * 1e3:.0f}"
        rows.append([v.name, f"{t * 1e3:.0f}", spread, f"{t0 / t:.2f}x", f"{v.peak / MiB:.0f}",
                     f"{v.peak / m0:.2f}x", v.note])
    print(f"{args.layers} x (conv 3x3 {args.channels}->{args.channels}, pad 1, ReLU) on "
          f"{args.batch} x {args.channels} x {args.size} x {args.size}, forward and backward; "
          f"{world.size} ranks, one BLAS thread each; median of {args.rounds} interleaved "
          f"rounds of {args.steps} step(s)")
    print(table(["variant", "ms", "min-max", "vs one process", "peak MiB", "vs one process",
                 ""], rows))
    print(f"vs one process: against {base.name!r}, the faster one-process run")
    print("time split of one instrumented step (ms):")
    print("\n".join(splits))
    on, off = (statistics.median(v.times) for v in spatial[:2])
    batched = variants[0]
    tb = statistics.median(batched.times)
    print(f"against the batched one process ({tb * 1e3:.0f} ms, {batched.peak / MiB:.0f} MiB): "
          f"spatial overlap on {tb / on:.2f}x, off {tb / off:.2f}x, peak memory per rank "
          f"{spatial[0].peak / batched.peak:.2f}x")
    print(f"spatial 1x{world.size}: {t0 / on:.2f}x one process (overlap on), {t0 / off:.2f}x "
          f"(off), peak memory per rank {spatial[0].peak / m0:.2f}x")


if __name__ == "__main__":
    main()
