"""A Transformer language model split inside its layers (tensor parallelism), optionally
with data parallelism across copies of the split.

::

    mpiexec -n 2 python examples/tensor_parallel/train_lm.py              # tensor 2
    mpiexec -n 4 python examples/tensor_parallel/train_lm.py              # tensor 4
    mpiexec -n 4 python examples/tensor_parallel/train_lm.py --data 2     # 2 x 2
    python examples/tensor_parallel/train_lm.py                           # one process

    world rank   0  1  2  3      (--data 2)
    data         0  0  1  1      each replica takes its half of every batch
    tensor       0  1  0  1      each rank holds its heads, its MLP columns, its words

The model (``model.py``) is written for one process; ``transformer_plan``
splits its queries, keys and values by heads, its output projections and
second MLP layers by rows, its embedding and output layer by vocabulary, and
``parallelize`` splits it over the mesh's tensor axis. It reads Python's own
reference manual (``text.py``: bundled with Python, nothing to download), one
character at a time. Under ``mnpar.random.scope`` its dropout masks are one
process's, so at any degree it computes what one process computes:
``--dtype float64`` logs the same losses at every split (a test checks it).
Rank 0 prints the loss (the mean over the replicas and the steps since the
last line), tokens per second and
each rank's bytes of parameters and of model state (parameters, gradients,
Adam's moments), and writes ``log.json`` to ``--out``.
"""
import argparse
import json
import os
import sys
import time

import chainer
import chainer.links as L
import numpy as np

import mnpar

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[1:1] = [os.path.dirname(HERE), HERE]
import common  # noqa: E402  what the examples share (examples/common.py)
from model import LanguageModel  # noqa: E402
from text import batch, corpus  # noqa: E402


def state_bytes(model):
    """(parameters, parameters + gradients + optimizer state): this rank's bytes."""
    params = total = 0
    for p in model.params():
        if p.array is None:
            continue
        params += p.array.nbytes
        total += p.array.nbytes * (1 + (p.grad is not None))
        rule = p.update_rule
        for value in (rule.state or {}).values() if rule is not None else ():
            total += getattr(value, "nbytes", 0)
    return params, total


def options():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=int, default=1, help="data-parallel replicas (the "
                        "tensor degree is the rest of the ranks)")
    parser.add_argument("--sequence", action="store_true",
                        help="sequence parallelism between the split layers")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batchsize", type=int, default=16, help="windows per step, whole")
    parser.add_argument("--length", type=int, default=64, help="characters a window")
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--log-interval", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="result/tensor_parallel")
    common.add_gpu_option(parser, "'pure_nccl' communicator: NCCL for the tensor group")
    return parser.parse_args()


def main() -> None:
    args = options()
    world = mnpar.create_communicator("pure_nccl" if args.gpu else "naive")
    if world.size % args.data or args.batchsize % args.data:
        raise SystemExit(f"--data {args.data} must divide the {world.size} ranks and the "
                         f"batch of {args.batchsize}")
    mesh = mnpar.Mesh(world, data=args.data, tensor=-1)
    device = common.device_of(world, args.gpu)
    dtype = np.dtype(args.dtype)
    text, ids, chars = corpus()
    np.random.seed(args.seed)  # every rank draws the same whole weights, then keeps its part
    with chainer.using_config("dtype", dtype):
        model = L.Classifier(LanguageModel(len(chars), args.units, args.heads, 4 * args.units,
                                           args.layers, args.length, args.dropout))
    plan = mnpar.tensor.transformer_plan(model, sequence=args.sequence)
    mnpar.tensor.parallelize(model, mesh, plan)
    model.to_device(device)
    optimizer = chainer.optimizers.Adam(alpha=2e-3)
    if args.data > 1:
        optimizer = mnpar.create_multi_node_optimizer(optimizer, mesh.comm("data"))
    optimizer.setup(model)
    rows = args.batchsize // args.data
    mine = slice(mesh.rank("data") * rows, (mesh.rank("data") + 1) * rows)
    data = mesh.comm("data") if args.data > 1 else None
    log = []
    if world.rank == 0:
        print(f"tensor {mesh.size('tensor')} x data {args.data} ({world.name}, {device}, "
              f"{args.dtype}{', sequence parallel' if args.sequence else ''}): "
              f"{len(chars)} characters, {len(text)} of text", flush=True)
        print(f"{'step':>6} {'loss':>8} {'tokens/s':>10}", flush=True)
    start, losses = time.perf_counter(), []
    with mnpar.random.scope(model, optimizer, seed=args.seed, data=data):
        for step in range(1, args.steps + 1):
            x, t = batch(ids, step, args.batchsize, args.length, args.seed)
            x, t = x[mine], t.reshape(args.batchsize, -1)[mine].reshape(-1)
            optimizer.update(model, device.send(x), device.send(t))
            losses.append(float(model.loss.array))
            if step % args.log_interval and step != args.steps:
                continue
            replicas = (mesh.comm("data").allgather_obj(losses) if data is not None
                        else [losses])
            loss = float(np.mean(replicas))  # the mean over the steps since the last line
            seconds = time.perf_counter() - start
            tokens = len(losses) * args.batchsize * args.length / seconds
            log.append({"step": step, "loss": loss, "tokens_per_s": tokens})
            if world.rank == 0:
                print(f"{step:>6} {loss:>8.4f} {tokens:>10.0f}", flush=True)
            start, losses = time.perf_counter(), []
    params, state = state_bytes(model)
    every = world.gather_obj((params, state))
    if world.rank == 0:
        print("per rank: " + ", ".join(f"rank {r} {p:,} bytes of parameters, {s:,} of model "
                                       "state" for r, (p, s) in enumerate(every)), flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "log.json"), "w") as f:
            json.dump({"log": log, "parameter_bytes": [p for p, _ in every],
                       "state_bytes": [s for _, s in every]}, f, indent=1)
    mesh.free()
    world.finalize()


if __name__ == "__main__":
    main()
