"""Predicted against measured step times on test hosts (mnpar.pipeline.CostModel).

    python benchmarks/scaling.py [--rounds 3]      (as root: makes test hosts)

Makes four test hosts (tests/cluster/_hosts.py: network namespaces joined by
a bridge, TCP between them, always removed at the end) and runs itself under
``mpiexec``:

1. links: raw mpi4py between two ranks inside h1 and between h1 and h2, a
   1 KiB ping-pong (latency alpha = half a round trip) and 4 MiB one way
   (bandwidth beta = n / (t - alpha)); the rate at which NumPy adds float32
   arrays (gamma); and mnpar's ``naive`` mean of one gradient of 1 KiB and
   of 32 MiB over the two ranks, which give the alpha and beta an allreduce
   sees (``collective``: ring(2, n) = 2 alpha + n / beta + n / (2 gamma) at
   both sizes). On this machine a non-blocking allreduce over TCP costs
   milliseconds however small, far more than a message's alpha.
2. steps, on 2 hosts x 1 rank, 2 x 2 and 4 x 1: the 8 x Linear(1024) MLP of
   bench_pipeline (batch 256) as a pipeline over every rank (``build_stage``,
   the seed MLP's loop, K = 4 micro-batches of 64 rows; gpipe, 1f1b, zb1), and
   data parallel (each rank the whole MLP on 64 rows; ``naive`` and
   ``hierarchical`` over every rank); on 2 x 2 also hybrid: a two-stage
   pipeline inside each host (1f1b, zb1), each stage averaged across the
   hosts with ``naive``. Every rank first times its own
   components (forward, whole backward, the optimizer's update) while every
   other rank does the same, so that the compute times carry the machine's
   sharing of its cores (this machine may have fewer cores than ranks); a
   backward is split into B and W by halves (for Linear layers they are one
   matrix product each). Then each configuration runs ``--rounds`` rounds of
   3 steps after 2 untimed ones; the best round's mean counts.

Rank 0 predicts each configuration's step from those measurements alone
(``CostModel``: the plan the updater runs, messages on the links, the
allreduce formulas) and the table gives predicted and measured milliseconds.
Every rank runs one BLAS thread. Prints the reason and exits 0 where test
hosts cannot be made (not root, no namespaces).
"""
import argparse
import json
import os
import sys
import time
from functools import partial

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "cluster"))
import _hosts  # noqa: E402
from _common import cpu, pingpong, table, timed  # noqa: E402

UNITS, LAYERS, BATCH, K, PER_RANK = 1024, 8, 256, 4, 64
SCHEDULES = ("gpipe", "1f1b", "zb1")
COMMUNICATORS = ("naive", "hierarchical")
WARM_UP = 8
LAYOUTS = ([1, 1], [2, 2], [1, 1, 1, 1])
SMALL, LARGE, HUGE = 1 << 10, 1 << 22, 1 << 25


def links_main() -> None:
    """Ranks 0 and 1: a 1 KiB round trip and 4 MiB one way, raw mpi4py; rank 0 prints."""
    import numpy as np
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, peer = world.rank, 1 - world.rank
    small, large, ack = np.zeros(SMALL, np.uint8), np.zeros(LARGE, np.uint8), np.zeros(1, np.uint8)

    round_trip = pingpong(lambda: world.Send(small, peer, 1), lambda: world.Recv(small, peer, 1),
                          rank)

    def one_way(repeat: int) -> float:
        world.Barrier()
        start = time.perf_counter()
        for _ in range(repeat):
            if rank == 0:
                world.Send(large, peer, 2)
            else:
                world.Recv(large, peer, 2)
        if rank == 0:
            world.Recv(ack, peer, 3)
        else:
            world.Send(ack, peer, 3)
        return (time.perf_counter() - start) / repeat

    timed(round_trip, 100)
    one_way(3)
    latency = min(timed(round_trip, 1000) for _ in range(5)) / 2
    per_message = min(one_way(20) for _ in range(5))
    small_mean = min(mean_grad_time(SMALL) for _ in range(3))
    large_mean = min(mean_grad_time(HUGE) for _ in range(3))
    if rank == 0:
        bandwidth = LARGE / max(per_message - latency, 1e-9)
        # ring(2, n) = 2 alpha + n / beta + n / (2 gamma), at two sizes: alpha and beta
        # as mnpar's allreduce sees them
        per_byte = (large_mean - small_mean) / (HUGE - SMALL) - 1 / (2 * sum_rate())
        reducing = 1 / max(per_byte, 1e-12)
        alpha = max(small_mean - SMALL * per_byte, 0.0) / 2
        print("RESULT " + json.dumps({"rank": 0, "link": [latency, bandwidth],
                                      "collective": [alpha, reducing]}), flush=True)


def mean_grad_time(nbytes: int, repeat: int = 5) -> float:
    """Seconds of mnpar's naive ``multi_node_mean_grad`` of one gradient of ``nbytes``."""
    import chainer
    import numpy as np

    import mnpar

    comm = mnpar.create_communicator("naive", timeout=120)
    link = chainer.Link()
    with link.init_scope():
        link.w = chainer.Parameter(np.zeros(nbytes // 4, np.float32))
    link.w.grad = np.ones(nbytes // 4, np.float32)
    comm.multi_node_mean_grad(link)
    barrier(comm)
    start = time.perf_counter()
    for _ in range(repeat):
        comm.multi_node_mean_grad(link)
    seconds = (time.perf_counter() - start) / repeat
    comm.finalize()
    return seconds


def mlp():
    import chainer
    import chainer.functions as F
    import chainer.links as L
    import numpy as np

    np.random.seed(0)
    layers: list = []
    for i in range(LAYERS):
        layers.append(L.Linear(UNITS, UNITS))
        if i < LAYERS - 1:
            layers.append(F.relu)
    return chainer.Sequential(*layers)


def best_time(fn, repeat: int = 7) -> float:
    """The fastest of ``repeat`` calls of ``fn`` after one untimed (the steps keep their
    best round too)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def forward_backward(link, rows: int, loss: bool = False):
    """(forward s, whole backward s) of ``link`` on ``rows`` random rows."""
    import chainer
    import chainer.functions as F
    import numpy as np

    x = chainer.Variable(np.random.rand(rows, UNITS).astype(np.float32))
    t = np.random.randint(0, UNITS, rows).astype(np.int32)
    holder = {}

    def forward():
        y = link(x)
        holder["y"] = F.softmax_cross_entropy(y, t) if loss else y

    def backward():
        forward()
        y = holder["y"]
        if not loss:
            y.grad = np.ones_like(y.array)
        link.cleargrads()
        x.grad = None
        y.backward()

    f = best_time(forward)
    return f, max(best_time(backward) - f, 0.0)


def update_time(target) -> float:
    """Seconds of a plain SGD ``update()`` of ``target`` on gradients already there (the
    optimizer a configuration trains with may also average, which is timed apart)."""
    import chainer

    optimizer = chainer.optimizers.SGD(0.01).setup(target)
    return best_time(lambda: optimizer.update())


def barrier(comm) -> None:
    """A barrier that sleeps while it waits, so an idle rank leaves its core alone."""
    request = comm.mpi_comm.Ibarrier()
    while not request.Test():
        time.sleep(1e-4)


def step_time(comm, step, rounds: int) -> float:
    """The best round's seconds per step (``WARM_UP`` untimed steps first, 3 a round).

    A new communicator's first large collectives over TCP are slow (the
    transport sets up its paths lazily): two warm-up steps left the first
    data-parallel configuration measured at 2 to 4 times its steady time."""
    for _ in range(WARM_UP):
        step()
    best = float("inf")
    for _ in range(rounds):
        barrier(comm)
        start = time.perf_counter()
        for _ in range(3):
            step()
        barrier(comm)
        best = min(best, (time.perf_counter() - start) / 3)
    return best


def pipeline_case(comm, kind: str, dp=None):
    """(updater, its optimizer, this rank's components) of the MLP pipelined over ``comm``;
    with ``dp``, the optimizer averages each stage's gradients over it (hybrid)."""
    import chainer
    import chainer.links as L
    import numpy as np

    import mnpar
    from mnpar.pipeline import PipelineUpdater, build_stage

    per = 2 * LAYERS // comm.size
    balance = [per] * (comm.size - 1) + [per - 1]
    stage = build_stage(mlp(), balance, comm)
    rng = np.random.RandomState(0)
    data = chainer.datasets.TupleDataset(rng.randn(BATCH * 4, UNITS).astype(np.float32),
                                         rng.randint(0, UNITS, BATCH * 4).astype(np.int32))
    target = L.Classifier(stage) if comm.rank == 0 else stage
    if comm.rank != 0:
        data = mnpar.datasets.create_empty_dataset(data)
    it = chainer.iterators.SerialIterator(data, BATCH)
    optimizer = chainer.optimizers.SGD(0.01)
    if dp is not None:
        optimizer = mnpar.create_multi_node_optimizer(optimizer, dp)
    optimizer.setup(target)
    # trace: two clock reads per action (microseconds against milliseconds), for traced_times
    updater = PipelineUpdater(it, optimizer, comm, K, schedule=kind, trace=True)
    return updater, target, list(stage.children())


def component_times(comm, components):
    """This rank's components' (F, B, W) seconds on one micro-batch, every rank at once;
    the loss is timed with rank 0's last component (the output)."""
    barrier(comm)
    times = []
    for c in components:
        has_params = any(True for _ in c.params())
        f, b = forward_backward(c, BATCH // K, loss=not has_params)
        times.append((f, b / 2, b / 2) if has_params else (f, b, 0.0))
    barrier(comm)
    return times


def traced_times(updater, components: int, steps: int = 3):
    """This rank's (F, B, W) seconds per component as the executor ran them: each
    action's time in ``steps`` traced steps, less the waits for messages it recorded
    (receives that waited over 50 us), the median over micro-batches and steps. A
    component whose backward ran whole gets it as B, and W 0."""
    import statistics
    from collections import defaultdict

    seen = defaultdict(list)
    for _ in range(steps):
        updater.update()
        events = updater.timeline
        waits = [e for e in events if e.label.startswith("wait ")]
        for e in events:
            if e.label.startswith("wait "):
                continue
            waited = sum(w.end - w.start for w in waits if e.start <= w.start and w.end <= e.end)
            microbatches, _, component = e.label[1:].partition(".c")
            merged = len(microbatches.split("+"))  # adjacent W actions run as one
            seen[int(component or 0), e.label[0]].append((e.end - e.start - waited) / merged)
    median = {key: statistics.median(ts) for key, ts in seen.items()}
    return [(median[c, "F"], median[c, "B"], median.get((c, "W"), 0.0))
            for c in range(components)]


def measure_pipeline(comm, updater, target, components, rounds: int):
    """A pipeline's step seconds as measured; every rank's component times, timed alone
    and traced in steps (two lists, one entry a rank); every rank's update seconds."""
    measured = step_time(comm, updater.update, rounds)
    alone = comm.allgather_obj(component_times(comm, components))
    traced = comm.allgather_obj(traced_times(updater, len(components)))
    return measured, (alone, traced), comm.allgather_obj(update_time(target))


def edge_bytes(graph):
    """Bytes each edge of the MLP pipeline carries per micro-batch."""
    return {e.id: BATCH // K * UNITS * 4 for e in graph.edges}


def steps_main(layout, link_args, rounds: int) -> None:
    """Every configuration on this layout; rank 0 predicts and prints RESULT."""
    import chainer
    import chainer.links as L
    import numpy as np

    import mnpar
    from mnpar.pipeline import CostModel, Group, Link, hosts_of

    intra, inter = Link(*link_args[:2]), Link(*link_args[2:4])
    collective = (Link(*link_args[5:7]), Link(*link_args[7:9]))
    model = CostModel(hosts_of(layout), intra, inter, link_args[4], collective)
    comm = mnpar.create_communicator("naive", timeout=120)
    rows = []
    for kind in SCHEDULES:
        updater, target, components = pipeline_case(comm, kind)
        measured, timings, update = measure_pipeline(comm, updater, target, components, rounds)
        runner = updater.runner
        if comm.rank == 0:
            graph = runner.graph
            nbytes = edge_bytes(graph)
            predicted = []
            for times in timings:
                seconds = {(r, c): t for r, ts in enumerate(times) for c, t in enumerate(ts)}
                ends = model.pipeline(graph, runner.plan(K), seconds, nbytes)
                predicted.append(model.predict_step(ends, (), dict(enumerate(update))))
            rows.append([f"pipeline {kind} K={K}", *predicted, measured])
        updater.finalize()
    if layout == [2, 2]:
        rows += hybrid_rows(comm, model, CostModel(hosts_of([2]), intra, inter, link_args[4],
                                                   collective), rounds)
    for name in COMMUNICATORS:
        dp = mnpar.create_communicator(name, timeout=120)
        net = L.Classifier(mlp())
        optimizer = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(0.01), dp)
        optimizer.setup(net)
        rng = np.random.RandomState(comm.rank)
        x = rng.randn(PER_RANK, UNITS).astype(np.float32)
        t = rng.randint(0, UNITS, PER_RANK).astype(np.int32)
        measured = step_time(comm, partial(optimizer.update, net, x, t), rounds)
        barrier(comm)
        f, b = forward_backward(net.predictor, PER_RANK)
        compute, update = zip(*comm.allgather_obj((f + b, update_time(net))))
        if comm.rank == 0:
            sizes = [p.array.nbytes for p in net.params()]
            group = Group(list(range(comm.size)), sizes, name)
            predicted = model.predict_step(dict(enumerate(compute)), [group],
                                           dict(enumerate(update)))
            rows.append([f"data parallel {name}", predicted, None, measured])
        dp.finalize()
    comm.finalize()
    if comm.rank == 0:
        print("RESULT " + json.dumps({"rank": 0, "rows": rows}), flush=True)


def hybrid_rows(comm, model, inside, rounds: int):
    """2 hosts x 2 ranks: a two-stage pipeline inside each host, each stage averaged
    with its twin on the other host (``naive``), as the hybrid tests lay it out."""
    from mnpar.pipeline import Group

    mp = comm.split(comm.rank // 2, comm.rank % 2)
    dp = comm.split(comm.rank % 2, comm.rank // 2)
    rows = []
    for kind in ("1f1b", "zb1"):
        updater, target, components = pipeline_case(mp, kind, dp)
        measured, timings, update = measure_pipeline(comm, updater, target, components, rounds)
        sizes = comm.allgather_obj([p.array.nbytes for p in target.params()])
        runner = updater.runner
        if comm.rank == 0:
            graph, schedule = runner.graph, runner.plan(K)
            nbytes = edge_bytes(graph)
            groups = [Group([s, s + 2], sizes[s], "naive") for s in (0, 1)]
            predicted = []
            for times in timings:
                ends = {}
                for first in (0, 2):  # each host's pipeline on its own times
                    seconds = {(r, c): t for r in (0, 1)
                               for c, t in enumerate(times[first + r])}
                    ends.update({first + r: t for r, t in
                                 inside.pipeline(graph, schedule, seconds, nbytes).items()})
                predicted.append(model.predict_step(ends, groups, dict(enumerate(update))))
            rows.append([f"hybrid {kind} K={K} + naive", *predicted, measured])
        updater.finalize()
    mp.finalize()
    dp.finalize()
    return rows


def sum_rate() -> float:
    """Bytes per second NumPy adds one 4 MiB float32 array into another."""
    import numpy as np

    a, b = np.ones(LARGE // 4, np.float32), np.ones(LARGE // 4, np.float32)
    return LARGE / best_time(lambda: np.add(a, b, out=a), 20)


# The answers of docs/scaling.rst: a stack of 32 transformer-like layers (hidden 2048,
# 12 h^2 = 50M parameters a layer, 1.6 B in all, fp32 gradients), micro-batches of
# 8192 tokens, 100 TFLOP/s a rank: a layer's forward 2 * 12 h^2 * 8192 FLOP = 8.2 ms,
# its B and W as much; activations on the wire in fp16 (8192 * 2048 * 2 B = 34 MB).
# 8 ranks a host joined at 100 GB/s, 5 us; hosts at 10 or 100 Gbit/s, 10 us.
HIDDEN, DEPTH, TOKENS, FLOPS, PER_HOST = 2048, 32, 8192, 100e12, 8


def scenarios() -> None:
    """Prints, from the model alone, steps of the layer stack at 8, 64 and 512 ranks."""
    from mnpar.pipeline import CostModel, Graph, Group, Link, hosts_of, plan

    layer_params = 12 * HIDDEN ** 2
    layer = 2 * layer_params * TOKENS / FLOPS  # one layer's forward on one micro-batch
    activation = TOKENS * HIDDEN * 2
    per_rank = 4  # micro-batches each rank's share of the global batch holds
    rows = []
    for gbit in (10, 100):
        inter = Link(10e-6, gbit / 8 * 1e9)
        for n in (8, 64, 512):
            model = CostModel(hosts_of([PER_HOST] * (n // PER_HOST)), Link(5e-6, 100e9), inter)
            ideal = per_rank * DEPTH * 3 * layer  # every rank busy, nothing else
            whole = [4 * layer_params] * DEPTH  # fp32 gradient bytes per layer
            compute = {r: ideal for r in range(n)}
            for name in ("naive", "hierarchical"):
                step = model.predict_step(compute, [Group(range(n), whole, name)])
                rows.append([f"{gbit}", f"{n}", f"data parallel {name}", "-",
                             f"{step:.2f}", f"{ideal / step:.0%}"])
            # A pipeline of 8 stages inside each host (4 layers a stage), its K micro-
            # batches the host's share; each stage averaged across hosts, the host's 8
            # stages sharing its link.
            stages = PER_HOST
            graph = Graph({r: [(None if r == 0 else (r - 1,),
                                None if r == stages - 1 else (r + 1,))] for r in range(stages)})
            times = {node: (4 * layer,) * 3 for node in graph.nodes()}
            shared = CostModel(hosts_of([1] * (n // PER_HOST)), inter,
                               Link(inter.latency, inter.bandwidth / PER_HOST))
            inside = CostModel(hosts_of([stages]), Link(5e-6, 100e9), inter)
            k = per_rank * stages
            for kind in ("gpipe", "1f1b", "zb1"):
                ends = inside.pipeline(graph, plan(graph, k, kind), times,
                                       {e.id: activation for e in graph.edges})
                group = Group(range(n // PER_HOST), [4 * layer_params * 4], "hierarchical")
                step = max(ends.values()) + shared.allreduce(group.ranks, group.sizes,
                                                             group.strategy)
                rows.append([f"{gbit}", f"{n}", f"pipeline 8 in a host, {kind}", f"{k}",
                             f"{step:.2f}", f"{ideal / step:.0%}"])
    print(table(["Gbit/s", "ranks", "layout", "K", "step s", "efficiency"], rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scenarios", action="store_true",
                        help="print the model's answers of docs/scaling.rst and exit")
    parser.add_argument("--mode", choices=("links", "steps"), help=argparse.SUPPRESS)
    parser.add_argument("--layout", help=argparse.SUPPRESS)
    parser.add_argument("--links", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if "PMI_RANK" in os.environ:
        if args.mode == "links":
            links_main()
        else:
            steps_main(json.loads(args.layout), json.loads(args.links), args.rounds)
        return 0
    if args.scenarios:
        scenarios()
        return 0
    print(f"CPU: {cpu()}")
    reason = _hosts.unavailable()
    if reason:
        print(f"scaling: skipped, needs {reason}")
        return 0
    me = [sys.executable, "-W", "ignore", os.path.abspath(__file__), "--rounds", str(args.rounds)]
    env = _hosts.Cluster.env(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                             MNPAR_TIMEOUT="120")
    rows = []
    with _hosts.Cluster(max(len(x) for x in LAYOUTS)) as hosts:
        links, collective = [], []
        for layout in ([2], [1, 1]):
            out = _hosts.results(hosts.run_ok(layout, me + ["--mode", "links"], timeout=300,
                                              env=env))[0]
            links += out["link"]
            collective += out["collective"]
        links += [sum_rate()] + collective
        print(f"links: inside a host alpha {links[0] * 1e6:.1f} us, beta "
              f"{links[1] / 1e9:.2f} GB/s; between hosts alpha {links[2] * 1e6:.1f} us, "
              f"beta {links[3] / 1e9:.2f} GB/s; sums at {links[4] / 1e9:.2f} GB/s; an "
              f"allreduce's alpha {links[5] * 1e6:.0f} us, beta {links[6] / 1e9:.2f} GB/s inside "
              f"a host, {links[7] * 1e6:.0f} us, {links[8] / 1e9:.2f} GB/s between hosts")
        for layout in LAYOUTS:
            argv = me + ["--mode", "steps", "--layout", json.dumps(layout),
                         "--links", json.dumps(links)]
            out = hosts.run_ok(layout, argv, timeout=600, env=env)
            where = f"{len(layout)} x {layout[0]}"
            for what, alone, traced, measured in _hosts.results(out)[0]["rows"]:
                rows.append([where, what, f"{measured * 1e3:.1f}", f"{alone * 1e3:.1f}",
                             f"{alone / measured:.2f}",
                             "-" if traced is None else f"{traced * 1e3:.1f}",
                             "-" if traced is None else f"{traced / measured:.2f}"])
    print(f"8 x Linear({UNITS}) MLP, batch {BATCH} (pipeline) or {PER_RANK} per rank (data "
          f"parallel); best of {args.rounds} rounds of 3 steps. Predicted from the "
          "components timed alone, and (pipelines) from their actions' times in traced steps")
    print(table(["hosts x ranks", "configuration", "measured ms", "alone ms", "/ measured",
                 "traced ms", "/ measured"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
