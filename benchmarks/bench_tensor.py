"""Tensor parallelism against one process: a wide Transformer block, 2 ranks.

::

    mpiexec -n 2 python benchmarks/bench_tensor.py [--units 1024] [--heads 16] [--rounds 5]

One pre-norm Transformer block (attention with ``--heads`` heads, an MLP of
``4 x --units``), float32, forward, backward and an Adam update on
``--batch`` x ``--length`` tokens: by default GPT-2 medium's width (1024, 16
heads), wide enough that its matrix products dominate a step. What every
rank computes whole (the norms, the residual sums, the loss) grows with the
width, the matrix products with its square: a narrower block gains less.
Two variants in interleaved rounds (each round runs both; the order
alternates):

* one process: the whole block on rank 0, while rank 1 waits in a sleeping
  poll (1 ms), so it leaves its core to whatever else runs there;
* tensor 2: the same block split by ``mnpar.tensor.transformer_plan`` over
  both ranks (heads, MLP columns and rows), the same batch on both.

Fairness: every rank, and the one process, runs one BLAS thread (pinned
with threadpoolctl, whatever the core count). A variant's time is its
slowest rank's; the table gives the median round, the fastest and the
slowest. Model state is what each rank holds of parameters, gradients and
Adam's two moments. CPU time (``time.process_time``, the busier rank's)
shows what a step costs where other processes take turns on the cores: on
a shared machine the wall-clock ratio is the machine's, the CPU ratio the
split's. The last line is::

    tensor 2 ranks: step X.XXx one process, model state per rank Y.YYx

(step: the one process's median time over tensor 2's; state: the larger
rank's bytes over the one process's).
"""
import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import chainer
import chainer.functions as F
import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_info, threadpool_limits

import mnpar

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(os.path.dirname(HERE), "examples", "tensor_parallel"))
from _common import table  # noqa: E402
from model import Block  # noqa: E402  the example's block, written for one process


class Net(chainer.Chain):
    """The block and a fixed linear read-out to a scalar loss."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        with self.init_scope():
            self.block = Block(d, heads, 4 * d, dropout=0.0)

    def forward(self, x: Any, w: Any) -> Any:
        return F.sum(self.block(x) * w)


def state_bytes(model: chainer.Link) -> int:
    total = 0
    for p in model.params():
        total += p.array.nbytes + (p.grad.nbytes if p.grad is not None else 0)
        for value in (p.update_rule.state or {}).values():
            total += getattr(value, "nbytes", 0)
    return total


def step_of(model: chainer.Link, optimizer: Any, x: Any, w: Any) -> Callable[[], None]:
    def step() -> None:
        loss = model(x, w)
        model.cleargrads()
        loss.backward()
        optimizer.update()
    return step


def wait_sleeping(request: MPI.Request) -> None:
    """Waits for ``request`` in a 1 ms sleeping poll: the idle rank leaves its core."""
    while not request.Test():
        time.sleep(1e-3)


def machine() -> str:
    from _mnpar_compat._openblas import cpu

    info = cpu() or {}
    pools = [f"{p['internal_api']} {p['version']}, {p['num_threads']} thread(s)"
             for p in threadpool_info() if p["user_api"] == "blas" and "numpy" in p["filepath"]]
    return (f"{info.get('model name', 'an unknown CPU')}, {os.cpu_count()} cores; numpy "
            f"{np.__version__}'s BLAS: {'; '.join(pools) or 'unknown'}; load average "
            f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--units", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="steps a variant times a round")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        raise SystemExit("run with mpiexec -n 2")
    comm = mnpar.create_communicator("naive")
    rng = np.random.RandomState(0)
    x = rng.standard_normal((args.batch, args.length, args.units)).astype(np.float32)
    w = rng.standard_normal(x.shape).astype(np.float32) / x.size ** 0.5

    def build() -> Net:
        np.random.seed(0)
        return Net(args.units, args.heads)

    split = build()
    mnpar.tensor.parallelize(split, comm, mnpar.tensor.transformer_plan(split))
    split_opt = chainer.optimizers.Adam().setup(split)
    steps: List[Callable[[], None]] = [step_of(split, split_opt, x, w)]
    if world.rank == 0:
        whole = build()
        whole_opt = chainer.optimizers.Adam().setup(whole)
        steps.insert(0, step_of(whole, whole_opt, x, w))
    limits = threadpool_limits(limits=1, user_api="blas")

    def one_process() -> Tuple[float, float]:
        world.Barrier()
        start, cpu = time.perf_counter(), time.process_time()
        if world.rank == 0:
            for _ in range(args.steps):
                steps[0]()
        cpu = time.process_time() - cpu
        wait_sleeping(world.Ibarrier())
        return (time.perf_counter() - start) / args.steps, world.bcast(cpu) / args.steps

    def tensor() -> Tuple[float, float]:
        world.Barrier()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            steps[-1]()
        mine = ((time.perf_counter() - start) / args.steps,
                (time.process_time() - cpu) / args.steps)
        return world.allreduce(mine[0], MPI.MAX), world.allreduce(mine[1], MPI.MAX)

    cases = {"one process": one_process, "tensor 2": tensor}
    for case in cases.values():  # warm-up: caches, MPI connections, optimizer state
        case()
    times: Dict[str, List[float]] = {name: [] for name in cases}
    cpus: Dict[str, List[float]] = {name: [] for name in cases}
    order = list(cases)
    for _ in range(args.rounds):
        for name in order:
            wall, cpu = cases[name]()
            times[name].append(wall)
            cpus[name].append(cpu)
        order.reverse()
    limits.restore_original_limits()
    mine = state_bytes(split)
    states = world.gather(mine)
    whole_state = state_bytes(whole) if world.rank == 0 else 0
    comm.finalize()
    if world.rank != 0:
        return
    t1, t2 = (statistics.median(times[n]) for n in cases)
    rows = [[name, f"{statistics.median(v) * 1e3:.0f}", f"{min(v) * 1e3:.0f}-{max(v) * 1e3:.0f}",
             f"{statistics.median(cpus[name]) * 1e3:.0f}"] for name, v in times.items()]
    c1, c2 = (statistics.median(cpus[n]) for n in cases)
    print(machine())
    print(f"one Transformer block (d {args.units}, {args.heads} heads, MLP {4 * args.units}), "
          f"{args.batch} x {args.length} tokens, float32, forward + backward + Adam; one BLAS "
          f"thread per rank; median of {args.rounds} interleaved rounds of {args.steps} steps")
    print(table(["variant", "ms/step", "min-max", "CPU ms/step"], rows))
    print(f"CPU time (the busier rank's): one process over tensor 2 {c1 / c2:.2f}x (what the "
          "step would gain where each rank had its core to itself)")
    print(f"model state: one process {whole_state / 2 ** 20:.1f} MiB; tensor 2 per rank "
          + ", ".join(f"{s / 2 ** 20:.1f}" for s in states) + " MiB")
    print(f"tensor 2 ranks: step {t1 / t2:.2f}x one process, model state per rank "
          f"{max(states) / whole_state:.2f}x")


if __name__ == "__main__":
    main()
