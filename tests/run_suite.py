"""Runs the whole test suite: once in one process, then under ``mpiexec``.

Each run has a hard wall-clock limit; a run past it is killed with its whole
process group, and every rank's log is printed, so a deadlock fails in
minutes and shows where each rank stood. A failing rank's log is printed
whole; the closing line adds up all runs (``N passed, N failed, N skipped``).

Usage: ``python tests/run_suite.py [--sizes 2 3 4] [--timeout S] [--single-timeout S]
[-- PYTEST-ARGS]``.
Set ``MPIEXEC`` to use another launcher, ``MPIEXEC_FLAGS`` for its options
(Open MPI needs ``--oversubscribe`` for more ranks than cores).
"""
import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# One folder per run, so runs at the same time never mix their counts.
LOGS = os.path.join(ROOT, "build", "test-logs", f"run-{os.getpid()}")


def find_mpiexec() -> str:
    if os.environ.get("MPIEXEC"):
        return os.environ["MPIEXEC"]
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else (shutil.which("mpiexec") or "mpiexec")


def run_limited(cmd, timeout, env):
    """Runs ``cmd`` in its own process group; kills the group past ``timeout``."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    return code, time.monotonic() - start


def read_counts(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def show(path, title):
    print(f"\n===== {title} ({os.path.relpath(path, ROOT)}) =====", flush=True)
    try:
        with open(path, errors="replace") as f:
            sys.stdout.write(f.read())
    except OSError:
        print("(no log written)")
    sys.stdout.flush()


def run_single(pytest_args, timeout, env):
    os.makedirs(LOGS, exist_ok=True)
    report = os.path.join(LOGS, "single.json")
    env = dict(env, MNPAR_TEST_REPORT=report)
    print("===== one process =====", flush=True)
    code, took = run_limited([sys.executable, "-m", "pytest", "-q", *pytest_args], timeout, env)
    counts = read_counts(report)
    ok = code == 0 and counts is not None
    if code is None:
        print(f"one-process run killed after {timeout} s")
    return ok, counts, took


def selecting(marker, pytest_args):
    """``pytest_args`` that also select ``marker``: a ``-m EXPR`` among them becomes
    ``-m "marker and (EXPR)"`` (pytest takes the last ``-m`` only)."""
    args = list(pytest_args)
    if "-m" in args[:-1]:
        i = args.index("-m")
        args[i + 1] = f"{marker} and ({args[i + 1]})"
        return args
    return ["-m", marker, *args]


def run_mpi(n, pytest_args, timeout, env):
    logdir = os.path.join(LOGS, f"n{n}")
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir)
    cmd = [find_mpiexec(), *shlex.split(os.environ.get("MPIEXEC_FLAGS", "")), "-n", str(n),
           sys.executable, os.path.join(HERE, "_rank_main.py"), logdir,
           "-q", *selecting("mpi", pytest_args)]
    code, took = run_limited(cmd, timeout, env)
    counts = [read_counts(os.path.join(logdir, f"rank{r}.json")) for r in range(n)]
    failed = [r for r, c in enumerate(counts) if c is None or c["failed"] or c["error"]]
    ok = code == 0 and not failed
    summary = counts[0] or {}
    print(f"===== {n} ranks: {summary.get('passed', 0)} passed, {summary.get('failed', 0)} "
          f"failed, {summary.get('skipped', 0)} skipped on rank 0, {took:.0f} s =====",
          flush=True)
    if code is None:
        print(f"{n}-rank run killed after {timeout} s: a deadlock? every rank's log follows")
        failed = list(range(n))
    elif not ok and not failed:
        failed = list(range(n))
    for r in failed:
        show(os.path.join(logdir, f"rank{r}.log"), f"{n} ranks, rank {r}")
    # Each test counts once per run (as rank 0 saw it); a failure on any rank counts.
    total = dict(counts[0] or {"passed": 0, "skipped": 0})
    total["failed"] = max((c or {}).get("failed", 0) + (c or {}).get("error", 0) for c in counts)
    total["error"] = 0
    if not ok and not total["failed"]:
        total["failed"] = 1  # a crash or kill with no test result still fails the run
    return ok, total, took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[2, 3, 4])
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--single-timeout", type=float, default=1800,
                        help="the one-process run's limit: it launches many jobs of its "
                             "own (fault matrix, examples), each under its own hard limit")
    parser.add_argument("--no-single", action="store_true", help="skip the one-process run")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    total = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    all_ok = True
    runs = [] if args.no_single else [("single", None)]
    runs += [("mpi", n) for n in args.sizes]
    for kind, n in runs:
        if kind == "single":
            ok, counts, _ = run_single(args.pytest_args, args.single_timeout, env)
        else:
            ok, counts, _ = run_mpi(n, args.pytest_args, args.timeout, env)
        all_ok &= ok
        for key in total:
            total[key] += (counts or {}).get(key, 0)
        if not ok and counts is None:
            total["failed"] += 1
    failed = total["failed"] + total["error"]
    if all_ok:
        shutil.rmtree(LOGS, ignore_errors=True)
    else:
        print(f"\nevery rank's log: {os.path.relpath(LOGS, ROOT)}")
    print(f"\n{total['passed']} passed, {failed} failed, {total['skipped']} skipped")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
