"""Shared pieces of the benchmarks: interleaved rounds, best-of timing, tables."""
import os
import random
import statistics
import subprocess
import time
from typing import Any, Callable, Dict, List, Tuple

from mpi4py import MPI


def best_of_interleaved(cases: Dict[str, Callable[[], float]], rounds: int) -> Dict[str, float]:
    """Each case's best over ``rounds`` rounds of ``interleaved``: a best-of
    discards rounds disturbed by something else."""
    return {name: min(times) for name, times in interleaved(cases, rounds).items()}


def interleaved(cases: Dict[str, Callable[[], float]], rounds: int) -> Dict[str, List[float]]:
    """Runs each case once per round, in turn; each case's time in every round.

    Interleaving puts every case under the same machine conditions. Each
    round runs the cases in another order (the same on every rank: a seeded
    shuffle), so no case always follows the same one: a case run right after
    raw MPI's measured slower than the same case run later, and a fixed
    rotation still always puts the same case after raw
    (docs/benchmarks_history.rst, "Figures behind choices in the code"). Each
    case returns its own measured seconds (so it can exclude its own set-up).
    """
    times: Dict[str, List[float]] = {name: [] for name in cases}
    order = list(cases)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        for name in order:
            MPI.COMM_WORLD.Barrier()
            times[name].append(cases[name]())
        shuffle(order)
    return times


def paired_excess(times: Dict[str, List[float]], name: str,
                  base: str = "raw") -> Tuple[float, float, float]:
    """Quartiles (first, median, third) of ``name``'s time minus ``base``'s in the
    same round, in seconds.

    A round's machine state (another process, the host's frequency) moves
    both cases of that round alike, so these differences spread far less
    than the times do: their median resolves changes that a best-of cannot
    (docs/benchmarks_history.rst, "Figures behind choices in the code").
    """
    diffs = [t - b for t, b in zip(times[name], times[base])]
    first, median, third = statistics.quantiles(diffs, n=4)
    return first, median, third


def paired_ratio(times: Dict[str, List[float]], name: str, base: str = "raw") -> float:
    """The median over rounds of ``base``'s time over ``name``'s in the same round:
    ``name``'s bandwidth over ``base``'s, measured under each round's conditions.

    Best-of figures take each case's luckiest round, and the two need not be
    alike: where one run's scatter is large, the median ratio is the steadier
    (docs/benchmarks_history.rst, "Figures behind choices in the code").
    """
    return statistics.median(b / t for t, b in zip(times[name], times[base]))


def timed(fn: Callable[[], None], repeat: int) -> float:
    """Seconds per call of ``fn`` over ``repeat`` calls, ranks started together."""
    MPI.COMM_WORLD.Barrier()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def table(header: List[str], rows: List[List[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = "  ".join(f"{{:>{w}}}" for w in widths)
    out = [line.format(*header), line.format(*["-" * w for w in widths])]
    out += [line.format(*r) for r in rows]
    return "\n".join(out)


def pingpong(send: Callable[[], None], recv: Callable[[], None], rank: int) -> Callable[[], None]:
    """One round trip between ranks 0 and 1: rank 0 sends first, rank 1 answers."""
    def one() -> None:
        if rank == 0:
            send()
            recv()
        else:
            recv()
            send()
    return one


def cpu() -> str:
    """This machine's CPU model and core count, as ``lscpu`` names it."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown CPU"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return f"{fields.get('Model name', 'unknown CPU').strip()}, {os.cpu_count()} cores"


def gpu_device(intra_rank: int) -> Any:
    """The chainer device of the rank ``intra_rank`` of a node, made current: its own GPU,
    shared round robin where the ranks outnumber the GPUs (as the examples pick them)."""
    import chainer
    import cupy

    device = chainer.get_device(f"@cupy:{intra_rank % cupy.cuda.runtime.getDeviceCount()}")
    device.use()
    return device


def synchronize(device: Any) -> None:
    """Waits for a GPU device's queued work, before a clock is read; nothing on the CPU."""
    if device is not None and device.xp.__name__ == "cupy":
        device.device.synchronize()


class GpuPeak:
    """The most bytes cupy's memory pool held during a block, beyond what was in use at its
    start (the pool keeps freed blocks, so what it holds at the end is the block's peak)."""

    def __enter__(self) -> "GpuPeak":
        import cupy

        self.pool = cupy.get_default_memory_pool()
        self.pool.free_all_blocks()
        self.start = self.pool.used_bytes()
        self.peak = 0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.peak = self.pool.total_bytes() - self.start
