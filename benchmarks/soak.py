"""Soak test: the seq2seq example's model on 3 ranks for thousands of iterations.

    mpiexec -n 3 python benchmarks/soak.py [--iterations 2000] [--warmup 200]

The example's model at a small size (2-layer LSTMs of 32 units, the built-in
toy corpus, whose vocabularies have 12 words) as a chain over three ranks.
Every rank's part is a MultiNodeChainList, so all three take part in the
wiring exchange::

    rank 0                 rank 1                      rank 2
    Encoder --(h, c)-----> DecoderRNN --states------> Linear -> loss
    (MultiNodeNStepRNN)    rank_in=None, rank_out=2    rank_in=1

Three runs, one after another in the same processes, each with a communicator,
model, optimizer, iterator and trainer of its own (the old ones finalized and
dropped):

====  ==========================================================================
A     iterations 1..N without a break: each iteration's loss, RSS and speed
B1    iterations 1..N/2 from the same seed; every rank snapshots N/2 to disk
B2    weights drawn from another seed, then ``mnpar.extensions.resume`` loads
      iteration N/2 from the files on disk; iterations N/2+1..N
====  ==========================================================================

Dropout masks come from generators reseeded from ``(seed, iteration)`` every
iteration (the example's ``reseed_every_iteration``), and the shuffle order is
a function of the seed and the previous order, so B2 can continue A bit for bit.

The criteria, in a table on rank 0 (exit status 1 if any fails):

* memory: every rank's RSS at iteration N is at most 5% above its RSS at the
  end of the warm-up (``--warmup``: default 10% of N, at least 100);
* MPI requests: after each run and a barrier, the transport's list of small
  sends in flight drains to empty, and an ``Iprobe`` of any source and tag on
  mnpar's private communicator finds no message left unreceived;
* resume: B's loss curve equals A's bit for bit over N/2+1..N, and every rank's
  final parameters after B2 equal those after A.
"""
import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import chainer
import chainer.links as L
import numpy as np
from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples", "seq2seq"))
from _common import table  # noqa: E402

import mnpar  # noqa: E402

# isort: split
import corpus  # noqa: E402  (the seq2seq example's own modules)
import models  # noqa: E402
from train_seq2seq import convert, reseed_every_iteration  # noqa: E402

N_RANKS = 3
LOSS_RANK = 2  # the rank that computes the loss
MAX_GROWTH = 5.0  # percent of RSS, from the end of the warm-up to the last iteration
SETTLE = 0.5  # seconds the checks poll for sends to complete and messages to show


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=2000,
                        help="iterations of the uninterrupted run (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="iterations before memory is measured (default: 10%% of "
                             "--iterations, at least 100)")
    parser.add_argument("--batchsize", type=int, default=32, help="default %(default)s")
    parser.add_argument("--unit", type=int, default=32, help="LSTM units (default %(default)s)")
    parser.add_argument("--layer", type=int, default=2, help="LSTM layers (default %(default)s)")
    parser.add_argument("--dropout", type=float, default=0.1,
                        help="dropout between LSTM layers (default %(default)s)")
    parser.add_argument("--toy-pairs", type=int, default=1000,
                        help="training pairs of the toy corpus (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="default %(default)s")
    parser.add_argument("--out", default=None,
                        help="where the snapshots go and stay (default: a temporary "
                             "directory, removed at the end)")
    args = parser.parse_args(argv)
    if args.iterations < 4:
        parser.error(f"--iterations must be at least 4, not {args.iterations}")
    if args.warmup is None:
        args.warmup = min(max(args.iterations // 10, 100), args.iterations // 2)
    if not 1 <= args.warmup < args.iterations:
        parser.error(f"--warmup must be in [1, {args.iterations}), not {args.warmup}")
    for name in ("batchsize", "unit", "layer", "toy_pairs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def rss_kib() -> int:
    """This process's resident set size in KiB (``VmRSS``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


class Scorer(chainer.Chain):
    """Rank 2: the decoder's output layer on the states rank 1 sends, and the loss."""

    def __init__(self, stage: mnpar.MultiNodeChainList) -> None:
        super().__init__()
        with self.init_scope():
            self.stage = stage

    def forward(self, *ys: Any) -> chainer.Variable:
        return models.word_loss(self, self.stage(), ys)


def build(comm: Any, args: argparse.Namespace, n_vocab: int) -> chainer.Link:
    """This rank's part of the chain; called with a batch, it returns its loss (or delegate)."""
    stage = mnpar.MultiNodeChainList(comm)
    size = (args.layer, args.unit, args.dropout)
    if comm.rank == 0:  # the encoder's own MultiNodeNStepRNN sends its states to rank 1
        stage.add_link(models.Encoder(comm, n_vocab, *size), rank_in=None, rank_out=None)
        return stage
    if comm.rank == 1:
        stage.add_link(models.DecoderRNN(comm, n_vocab, *size), rank_in=None, rank_out=2)
        return stage
    stage.add_link(L.Linear(args.unit, n_vocab), rank_in=1, rank_out=None)
    return Scorer(stage)


class Probe(chainer.training.Extension):
    """Records every iteration's loss (on the loss rank), RSS and small sends in flight."""

    trigger = 1, "iteration"

    def __init__(self, comm: Any, iterations: int) -> None:
        self.transport = comm._t  # the communicator's transport: private comm, sends in flight
        # Filled in place, indexed by iteration, so that recording allocates nothing.
        self.loss = np.full(iterations + 1, np.nan)
        self.rss = np.zeros(iterations + 1, np.int64)
        self.pending = np.zeros(iterations + 1, np.int64)
        self.time = np.zeros(iterations + 1)

    def __call__(self, trainer: chainer.training.Trainer) -> None:
        i = trainer.updater.iteration
        loss = trainer.observation.get("main/loss")
        if loss is not None:
            self.loss[i] = float(loss.array)
        self.rss[i] = rss_kib()
        self.pending[i] = len(self.transport.outbox.pending)
        self.time[i] = time.perf_counter()


def check_requests(comm: Any) -> Tuple[int, List[Tuple[int, int, int]]]:
    """After a barrier: mnpar's sends not yet complete, and (source, tag, bytes) of every
    message left unreceived on its private communicator (received here); collective.

    Each rank's sends get ``SETTLE`` seconds to complete, and its receives as long
    to show whatever is still on its way.
    """
    transport = comm._t  # the communicator's transport: private comm, sends in flight
    transport.arrive("soak: request check")
    transport.outbox.reap()  # forgets completed sends, as the outbox does every few sends
    deadline = time.monotonic() + SETTLE
    while transport.outbox.pending and time.monotonic() < deadline:
        time.sleep(1e-3)
        transport.outbox.reap()
    pending = len(transport.outbox.pending)
    transport.arrive("soak: stray message check")  # every rank's sends are done (or counted)
    strays = []
    status = MPI.Status()
    deadline = time.monotonic() + SETTLE
    while time.monotonic() < deadline:
        msg = transport.comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        if msg is None:
            time.sleep(1e-3)
            continue
        nbytes = status.Get_count(MPI.BYTE)
        msg.Recv([np.empty(nbytes, np.uint8), MPI.BYTE])
        strays.append((status.Get_source(), status.Get_tag(), nbytes))
    # Every rank is done looking before any ends the communicator: a rank that still
    # looked would take another's end notice (``finalize``) for a stray message.
    transport.arrive("soak: stray message check done")
    return pending, strays


def digest(model: chainer.Link) -> str:
    """A hash of every parameter's name and bytes."""
    h = hashlib.sha256()
    for name, param in sorted(model.namedparams()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(param.array).tobytes())
    return h.hexdigest()


def train(args: argparse.Namespace, data: List[np.ndarray], n_vocab: int, last: int,
          weight_seed: int, snapshot: bool = False, resume: bool = False) -> Dict[str, Any]:
    """One run to iteration ``last`` on a new communicator; what it measured."""
    comm = mnpar.create_communicator("naive")
    np.random.seed(weight_seed)  # the weights' initializers draw from numpy's generator
    model = build(comm, args, n_vocab)
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(
        data, args.batchsize,
        order_sampler=mnpar.extensions.ResumableShuffleOrderSampler(args.seed))
    updater = chainer.training.StandardUpdater(iterator, optimizer, converter=convert,
                                               device=chainer.get_device("@numpy"))
    trainer = chainer.training.Trainer(updater, (last, "iteration"), out=args.out)
    trainer.extend(reseed_every_iteration(args.seed, False))
    probe = Probe(comm, last)
    trainer.extend(probe)
    if snapshot:
        trainer.extend(mnpar.extensions.snapshot(comm, trigger=(last, "iteration")))
    first = 0
    if resume:
        loaded = mnpar.extensions.resume(comm, trainer, args.out)
        if loaded is None:
            raise RuntimeError(f"rank {comm.rank}: no snapshot to resume from in {args.out}")
        first = loaded
    MPI.COMM_WORLD.Barrier()
    start = time.perf_counter()
    trainer.run()
    seconds = time.perf_counter() - start
    pending, strays = check_requests(comm)
    result = dict(first=first, seconds=seconds, loss=probe.loss, rss=probe.rss, time=probe.time,
                  peak_pending=int(probe.pending[first + 1:].max()), pending=pending,
                  strays=strays, digest=digest(model))
    comm.finalize()
    return result


def load_data(args: argparse.Namespace, rank: int) -> Tuple[List[np.ndarray], int]:
    """This rank's side of the toy pairs as id arrays, and that side's vocabulary size."""
    pairs = corpus.toy_pairs("train", args.toy_pairs)
    side = 0 if rank == 0 else 1  # the encoder reads the sources, the others the targets
    vocab = corpus.Vocabulary([pair[side] for pair in pairs], len(corpus.DICTIONARY) + 2)
    return [vocab.encode(pair[side]) for pair in pairs], len(vocab)


def summarize(args: argparse.Namespace, a: Dict[str, Any], b1: Dict[str, Any],
              b2: Dict[str, Any]) -> Dict[str, Any]:
    """This rank's figures for the report."""
    n, half, w = args.iterations, args.iterations // 2, args.warmup
    mine = dict(rss_warm=int(a["rss"][w]), rss_end=int(a["rss"][n]),
                rss_peak=int(a["rss"][w:].max()), seconds=a["seconds"],
                steady=(n - w) / (a["time"][n] - a["time"][w]),
                peak_pending=max(r["peak_pending"] for r in (a, b1, b2)),
                pending=[r["pending"] for r in (a, b1, b2)],
                strays=[r["strays"] for r in (a, b1, b2)],
                same_params=a["digest"] == b2["digest"], resumed_at=b2["first"])
    if MPI.COMM_WORLD.rank == LOSS_RANK:
        resumed = np.concatenate([b1["loss"][1:half + 1], b2["loss"][half + 1:n + 1]])
        whole = a["loss"][1:n + 1]
        mine.update(loss_a=whole, loss_b=resumed)
    return mine


def compare(x: np.ndarray, y: np.ndarray) -> Tuple[str, bool]:
    """The largest difference of two loss curves, in words, and whether they are bit-equal."""
    if np.isnan(x).any() or np.isnan(y).any():
        return "losses missing", False
    if np.array_equal(x, y):
        return "0 (bit-equal)", True
    return f"{float(np.abs(x - y).max()):.3g}", False


def report(args: argparse.Namespace, figures: List[Dict[str, Any]]) -> bool:
    """Prints the table on rank 0; True if every criterion passes."""
    n, half, w = args.iterations, args.iterations // 2, args.warmup
    print(f"soak: seq2seq, {args.layer}-layer LSTMs of {args.unit} units, toy corpus "
          f"({args.toy_pairs} pairs), batch {args.batchsize}, dropout {args.dropout}, "
          f"{N_RANKS} ranks (encoder | decoder LSTM | output layer + loss)")
    slowest = max(f["seconds"] for f in figures)
    steady = min(f["steady"] for f in figures)
    print(f"run A: {n} iterations in {slowest:.1f} s, {n / slowest:.2f} iterations/s "
          f"({steady:.2f} after the warm-up); run B: {half} iterations, snapshot, then "
          f"{n - half} more resumed from iteration {figures[0]['resumed_at']} with new "
          "objects\n")
    rows = []
    growths = []
    for rank, f in enumerate(figures):
        growth = 100.0 * (f["rss_end"] - f["rss_warm"]) / f["rss_warm"]
        growths.append(growth)
        rows.append([str(rank), f"{f['rss_warm'] / 1024:.1f}", f"{f['rss_end'] / 1024:.1f}",
                     f"{f['rss_peak'] / 1024:.1f}", f"{growth:+.2f}%", str(f["peak_pending"]),
                     "/".join(str(p) for p in f["pending"]),
                     "/".join(str(len(s)) for s in f["strays"])])
    print(table(["rank", f"RSS@{w} MiB", f"RSS@{n} MiB", "peak MiB", "growth",
                 "in flight (max)", "pending A/B1/B2", "stray A/B1/B2"], rows))
    for rank, f in enumerate(figures):
        for run, strays in zip(("A", "B1", "B2"), f["strays"]):
            for source, tag, nbytes in strays:
                print(f"  rank {rank}, run {run}: unreceived message from rank {source}, "
                      f"tag {tag}, {nbytes} bytes")
    loss_a, loss_b = figures[LOSS_RANK]["loss_a"], figures[LOSS_RANK]["loss_b"]
    second, equal = compare(loss_a[half:], loss_b[half:])
    pending = sum(sum(f["pending"]) for f in figures)
    strays = sum(len(s) for f in figures for s in f["strays"])
    same = all(f["same_params"] for f in figures)
    checks = [
        ("RSS growth after warm-up (worst rank)", f"{max(growths):+.2f}%",
         f"<= {MAX_GROWTH:g}%", max(growths) <= MAX_GROWTH),
        ("sends pending after barrier (all runs)", str(pending), "0", pending == 0),
        ("stray messages after barrier (all runs)", str(strays), "0", strays == 0),
        (f"max |loss A - loss B|, iterations {half + 1}-{n}", second, "0", equal),
        ("final parameters A == B, every rank", "yes" if same else "no", "yes", same),
    ]
    print()
    print(table(["criterion", "measured", "limit", "verdict"],
                [[c, m, lim, "PASS" if ok else "FAIL"] for c, m, lim, ok in checks]))
    k = min(50, n // 4)
    print(f"\nmean loss of A's first {k} iterations {np.mean(loss_a[:k]):.4f}, last {k} "
          f"{np.mean(loss_a[-k:]):.4f}; iterations 1-{half}, A vs B1: "
          f"{compare(loss_a[:half], loss_b[:half])[0]}")
    passed = all(ok for *_, ok in checks)
    print("soak: PASS" if passed else "soak: FAIL", flush=True)
    return passed


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    world = MPI.COMM_WORLD
    if world.size != N_RANKS:
        if world.rank == 0:
            print(f"error: soak.py runs on exactly {N_RANKS} ranks, not {world.size}: "
                  f"mpiexec -n {N_RANKS} python {sys.argv[0]}", file=sys.stderr)
        return 2
    temporary = args.out is None
    args.out = world.bcast(tempfile.mkdtemp(prefix="mnpar-soak-") if temporary and
                           world.rank == 0 else args.out)
    data, n_vocab = load_data(args, world.rank)
    half = args.iterations // 2
    a = train(args, data, n_vocab, args.iterations, args.seed)
    b1 = train(args, data, n_vocab, half, args.seed, snapshot=True)
    b2 = train(args, data, n_vocab, args.iterations, args.seed + 1, resume=True)
    figures = world.gather(summarize(args, a, b1, b2))
    passed = report(args, figures) if world.rank == 0 else False
    passed = world.bcast(passed)
    world.Barrier()
    if temporary and world.rank == 0:
        shutil.rmtree(args.out, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
