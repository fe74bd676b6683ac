"""One-thread GEMM and the seed MLP in one process, by the OpenBLAS kernels they run on.

Run in one process (no mpiexec)::

    python benchmarks/bench_openblas.py [--rounds 3] [--also OTHER_PYTHON ...]

OpenBLAS fixes its kernels when it loads, so each configuration runs in a
child interpreter, one thread (``OPENBLAS_NUM_THREADS=1``):

* ``as started``: what a user gets, mnpar's start-up hook included;
* ``no hook``: ``MNPAR_OPENBLAS_CORETYPE=0``, the library's own choice;
* ``generic``: ``OPENBLAS_CORETYPE=Prescott``, what numpy 1.26's OpenBLAS
  falls back to on a CPU it does not know (the Intel VMs of family 6 model
  207), and what the hook prevents there;
* ``--also PY``: another interpreter as started (numpy 2's venv, say).

Measured: GFLOP/s of a 256x1024 @ 1024x1024 float32 product, and updates per
second of the seed MLP (8 Linear layers of 1024 units, batch 256, SGD: the
pipeline benchmark's ``single``). Rounds interleave the configurations and
each keeps its best round; ``vs generic`` divides by the generic kernels' figure.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, bench_pipeline


def child(iters):
    """Measures this interpreter; prints one JSON line."""
    import chainer
    import chainer.links as L
    import numpy as np
    from _common import timed
    from bench_pipeline import BATCH, dataset, mlp
    from threadpoolctl import threadpool_info

    a = np.random.RandomState(0).randn(256, 1024).astype(np.float32)
    b = np.random.RandomState(1).randn(1024, 1024).astype(np.float32)
    a @ b
    best = min(timed(lambda: a @ b, 20) for _ in range(3))
    updater = chainer.training.StandardUpdater(
        chainer.iterators.SerialIterator(dataset(), BATCH),
        chainer.optimizers.SGD(0.01).setup(L.Classifier(mlp())))
    updater.update()
    pools = [p for p in threadpool_info() if p["user_api"] == "blas"]
    print(json.dumps({
        "gflops": 2 * 256 * 1024 * 1024 / best / 1e9,
        "its": 1 / timed(updater.update, iters),
        "core": ", ".join(sorted(f"{p['internal_api']} {p['version']} {p['architecture']}"
                                 for p in pools)),
        "numpy": np.__version__, "variable": os.environ.get("OPENBLAS_CORETYPE", "")}))


def measure(python, iters, **env):
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **env)
    out = subprocess.run([python, "-W", "ignore", __file__, "--child", "--iters", str(iters)],
                         env=environ, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def cpu_name():
    from _mnpar_compat._openblas import cpu

    info = cpu() or {}
    return (f"{info.get('model name', 'an unknown CPU')} (family {info.get('cpu family')} "
            f"model {info.get('model')})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5, help="MLP updates per round")
    parser.add_argument("--also", action="append", default=[], metavar="PYTHON",
                        help="another interpreter to run as started")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.iters)
    configs = {"as started": (sys.executable, {}),
               "no hook": (sys.executable, {"MNPAR_OPENBLAS_CORETYPE": "0"}),
               "generic": (sys.executable, {"OPENBLAS_CORETYPE": "Prescott"})}
    for python in args.also:
        configs[f"as started: {python}"] = (python, {})
    best = {}
    for _ in range(args.rounds):
        for name, (python, env) in configs.items():
            found = measure(python, args.iters, **env)
            kept = best.setdefault(name, found)  # each figure keeps its own best round
            kept["gflops"] = max(kept["gflops"], found["gflops"])
            kept["its"] = max(kept["its"], found["its"])
    print(f"one BLAS thread on {cpu_name()}; best of {args.rounds} interleaved rounds")
    base = best["generic"]
    rows = [[name, r["numpy"], r["variable"] or "-", r["core"], f"{r['gflops']:.1f}",
             f"{r['gflops'] / base['gflops']:.2f}x", f"{r['its']:.2f}",
             f"{r['its'] / base['its']:.2f}x"] for name, r in best.items()]
    from _common import table

    print(table(["configuration", "numpy", "OPENBLAS_CORETYPE", "BLAS kernels", "GEMM GFLOP/s",
                 "vs generic", "MLP it/s", "vs generic"], rows))


if __name__ == "__main__":
    main()
