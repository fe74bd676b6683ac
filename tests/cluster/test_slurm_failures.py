"""The failures a cluster has, under Slurm: each ends the job in time, cause first, and a
requeued job continues from the last snapshot bit for bit.

Every case runs one batch job per launcher side by side (``_mpis.LAUNCHERS``:
``srun`` with PMI-2 and with PMIx, hydra's ``mpiexec`` and Open MPI's
``mpirun`` inside the allocation), each training ``examples/mlp`` over two
nodes with a snapshot every 20 iterations and ``--resume auto``
(``scripts/faulty_mlp.py``: the example plus an armed fault). From iteration
40 on, the job is slowed down while the test acts:

=========  ===================================================  ===========
case       what happens                                         job ends in
=========  ===================================================  ===========
raise      rank 1 raises                                        10 s
kill       rank 1 gets ``SIGKILL``                              10 s
scancel    ``scancel`` the job (``SIGTERM``, ``SIGKILL`` later) 10 s
timelimit  ``--time=2`` passes (``SIGTERM``, then ``SIGKILL``)  10 s
cut        h2, rank 1's host, is cut off the network            30 s
=========  ===================================================  ===========

A cut-off host is found by mnpar's heartbeat after 20 s; then ``srun`` waits
``KillWait`` + 2 s for the lost node's tasks (35 s here), and ``mpirun``
for its daemon there until Slurm sets the node DOWN, ``SlurmdTimeout`` later
(70 s here). The job's standard error
must give the cause before any rank's error; every rank must be gone; then
the job is requeued (``scontrol requeue``, or by Slurm itself after a node
failure), resumes from a snapshot of iteration 40 or later, and saves the
parameters of an uninterrupted run, bit for bit. To save time the cases run
in rounds: raise, kill and scancel side by side (twelve jobs on h1 and h2),
then cut; the time-limit jobs and the uninterrupted run start first, on h3
and h4. A thread polls every job's state every 0.1 s, so a job's end is seen
while the test acts on others. Measured times are printed at the end of the
run (``_timings``).
"""
import datetime
import os
import re
import shlex
import signal
import threading
import time
from typing import Dict, List, Optional

import numpy as np
import pytest
from _hosts import ROOT, Cluster
from _mpis import LAUNCHERS, Launcher, rank_of
from _slurm import KILL_WAIT, SLURMD_TIMEOUT
from _timings import record

FAULTY = os.path.join(ROOT, "tests", "cluster", "scripts", "faulty_mlp.py")
TRAIN = ["--epoch", "2", "--snapshot-interval", "20", "--seed", "1"]
AT = 40  # the iteration from which the fault is armed (a snapshot's)
BOUND = {"raise": 10.0, "kill": 10.0, "scancel": 10.0, "timelimit": 10.0, "cut": 30.0}
# A cut-off host: mnpar's heartbeat finds it after 20 s and aborts; then srun waits
# KillWait + 2 s for the lost node's tasks, and mpirun until Slurm sets the node DOWN.
CUT = {"srun": 20.0 + KILL_WAIT + 2 + 8, "mpirun": SLURMD_TIMEOUT + 40.0}
RUNNING = ("PENDING", "CONFIGURING", "RUNNING")
# The cause, as the job's standard error gives it (by launcher where they differ). Before it
# may come launcher chatter that names nothing (srun's "Job step aborted", Open MPI's
# "Forwarding signal 18"), but no rank's error: "[rank N]" lines come from mnpar, and none may
# come before the cause. hydra's mpiexec under Slurm names no rank when one is killed.
CAUSE = {
    "raise": r"^\[rank 1\] Exception in main training loop: rank 1 fails at iteration 40",
    "kill": {"srun": r"^srun: error: h2: task 1: Killed",
             # hydra names no rank; where the killed rank's proxy goes first, the
             # other proxy reports its lost connection instead (seen 1 run in 6)
             "mpiexec": r"one of the processes terminated badly; aborting|"
                        r"HYD_pmcd_pmip_control_cmd_cb .*assert \(!closed\) failed",
             "mpirun": r"noticed that process rank 1 .* on node h2 exited on signal 9 \(Killed\)"},
    "scancel": r"^slurmstepd-h1: error: \*\*\* (JOB|STEP) \d+(\.\d+)? ON h1 CANCELLED AT ",
    "timelimit": r"^slurmstepd-h3: error: \*\*\* JOB \d+ ON h3 CANCELLED AT \S+ DUE TO TIME LIMIT",
    "cut": r"^\[rank 0\] Exception in main training loop: rank 0: lost rank 1 on host 'h2'",
}


def kind(launcher: Launcher) -> str:
    """``srun``, ``mpiexec`` (hydra) or ``mpirun`` (Open MPI)."""
    return "srun" if launcher.srun else launcher.mpi.mpiexec.split(".")[0]


def cause(case: str, launcher: Launcher) -> str:
    found = CAUSE[case]
    return found[kind(launcher)] if isinstance(found, dict) else found


def cause_first(case: str, launcher: Launcher, text: str) -> bool:
    """Whether ``text`` gives the cause, and no rank's error before it."""
    found = re.search(cause(case, launcher), text, re.M)
    return found is not None and "[rank " not in text[:found.start()]


class Job:
    """One batch job of a case: its launcher, its files, its id."""

    def __init__(self, slurm, folder, case: str, launcher: Launcher, nodes: str,
                 minutes: int, pace: float) -> None:
        self.case, self.launcher, self.slurm = case, launcher, slurm
        self.name = f"{case}-{launcher.name.replace('/', '-')}"
        self.out, self.err = folder / f"{self.name}.out", folder / f"{self.name}.err"
        self.result, self.marker = folder / f"{self.name}-result", folder / f"{self.name}.armed"
        self.marker.touch()
        program = [launcher.mpi.python, FAULTY, *TRAIN, "--out", str(self.result),
                   "--resume", "auto"]
        env = slurm.env(**launcher.mpi.env(), MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1",
                        MNPAR_TIMEOUT="600", FAULT="raise" if case == "raise" else "",
                        FAULT_MARKER=str(self.marker), FAULT_AT=str(AT), FAULT_PACE=str(pace))
        self.id = int(slurm.run_ok(
            ["sbatch", "--parsable", "-J", self.name, "-N", "2", "--ntasks-per-node=1",
             f"--nodelist={nodes}", f"--time={minutes}", "--requeue", "--open-mode=append",
             "-o", str(self.out), "-e", str(self.err),
             "--wrap", shlex.join(launcher.inside(2, 1, program))], env=env, cwd=str(folder)))
        self.ended: Optional[float] = None
        self.problems: List[str] = []

    def state(self) -> str:
        return self.slurm.job(self.id)["JobState"]

    def text(self, which: str = "err") -> str:
        path = self.err if which == "err" else self.out
        return path.read_text(errors="replace") if path.exists() else ""

    def armed(self) -> bool:
        return "FAULT armed" in self.text("out")

    def started(self) -> bool:
        """Whether rank 0 has started training (or the job has ended before)."""
        return "from iteration" in self.text("out") or self.state() not in RUNNING

    def ranks(self) -> Dict[int, int]:
        """``{rank: pid}`` of this job's ranks still running, on any host."""
        found = {}
        for host in range(1, 5):
            for pid in Cluster.pids(host):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if FAULTY.encode() not in f.read():
                            continue
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        environ = dict(v.split("=", 1) for v in
                                       f.read().decode(errors="replace").split("\0") if "=" in v)
                except OSError:
                    continue
                if environ.get("SLURM_JOB_ID") == str(self.id):
                    found[rank_of(environ)] = pid
        return found


def wait_for(jobs: List[Job], done, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    waiting = list(jobs)
    while waiting:
        waiting = [j for j in waiting if not done(j)]
        if waiting and time.monotonic() > deadline:
            raise AssertionError(f"{what}: still waiting after {timeout} s for "
                                 + ", ".join(f"{j.name} ({j.state()})\n{j.text()[-3000:]}"
                                             for j in waiting))
        time.sleep(0.1)


class Watcher(threading.Thread):
    """Notes when each job is first seen ended (or requeued by Slurm), polling every job
    in one ``scontrol`` call every 0.1 s, while the test acts on others."""

    def __init__(self, slurm, jobs: List[Job]) -> None:
        super().__init__(daemon=True)
        self.slurm, self.jobs, self.stop = slurm, jobs, threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stop.is_set() and any(j.ended is None for j in self.jobs):
            try:
                states = self.slurm.jobs()
            except AssertionError:
                continue
            now = time.time()
            for job in self.jobs:
                fields = states.get(job.id, {})
                if job.ended is None and fields and (fields["JobState"] not in RUNNING
                                                     or fields["Restarts"] != "0"):
                    job.ended = now
            time.sleep(0.1)


def requeue_and_finish(slurm, jobs: List[Job]) -> None:
    """Requeues every job (unless Slurm did), lets it start now, waits for its end."""
    for job in jobs:
        if job.marker.exists():
            job.marker.unlink()
    wait_for(jobs, lambda j: j.state() not in ("COMPLETING",) + RUNNING[1:], 60,
             "the failed jobs to finish completing")
    time.sleep(2)  # not in the second a job ended: slurmd would refuse it (credential revoked)
    for job in jobs:
        if job.state() != "PENDING":
            slurm.scontrol("requeue", str(job.id))
        slurm.scontrol("update", f"JobId={job.id}", "StartTime=now")
    wait_for(jobs, lambda j: j.state() not in RUNNING + ("COMPLETING",), 240,
             "the requeued jobs to end")


def models(folder) -> Dict[int, Dict[str, bytes]]:
    found = {}
    for rank in (0, 1):
        with np.load(folder / f"model_rank{rank}.npz") as f:
            found[rank] = {k: f[k].tobytes() for k in f.files}
    return found


def launchers() -> List[Launcher]:
    """The launchers whose MPI is installed here."""
    return [launcher for launcher in LAUNCHERS.values() if launcher.mpi.unavailable() is None]


def act(case: str, jobs: List[Job]) -> Dict[str, float]:
    """Does what ``case`` does to the jobs, once each is armed; the time of each act."""
    if case in ("raise", "timelimit"):
        return {}
    wait_for(jobs, Job.armed, 180, "the jobs to reach their snapshot of iteration 40")
    if case == "cut":
        now = time.time()
        Cluster.cut(2)
        return {job.name: now for job in jobs}
    acted = {}
    for job in jobs:
        if case == "kill":
            victim = job.ranks()[1]
            acted[job.name] = time.time()
            os.kill(victim, signal.SIGKILL)
        else:
            acted[job.name] = time.time()
            job.slurm.run_ok(["scancel", str(job.id)])
    return acted


def seconds(stamp: str) -> float:
    """Slurm's time stamp (this machine's time zone, whole seconds) as ``time.time()``."""
    return datetime.datetime.fromisoformat(stamp).timestamp()


def when_it_failed(case: str, job: Job, acted: Dict[str, float]) -> Optional[float]:
    """The wall-clock time of the failure: the act, or what the job's output says."""
    if case == "raise":
        stamp = re.search(r"FAULT raises at ([0-9.]+)", job.text("out"))
        return float(stamp[1]) if stamp else None
    if case == "timelimit":
        stamp = re.search(r"CANCELLED AT (\S+) DUE TO TIME LIMIT", job.text())
        return seconds(stamp[1]) if stamp else None
    return acted.get(job.name)


def bound_of(case: str, job: Job) -> float:
    return CUT.get(kind(job.launcher), BOUND[case]) if case == "cut" else BOUND[case]


def check(slurm, job: Job, acted: Dict[str, float]) -> None:
    """Notes in ``job.problems`` what is wrong with how the job ended."""
    if job.case == "timelimit":  # long over when this test looks: Slurm's whole seconds
        job.ended = seconds(slurm.job(job.id)["EndTime"])
    failed = when_it_failed(job.case, job, acted)
    if failed is None or job.ended is None:
        job.problems.append(f"no failure or no end seen\n{job.text()[-3000:]}")
        return
    took = job.ended - failed
    record(job.case, job.launcher.name, took, bound_of(job.case, job))
    if took >= bound_of(job.case, job):
        job.problems.append(f"ended {took:.1f} s after the failure\n{job.text()[-3000:]}")
    if not cause_first(job.case, job.launcher, job.text()):
        job.problems.append(f"the cause is not first\n{job.text()[:3000]}")
    try:
        wait_for([job], lambda j: not j.ranks(), 15, f"{job.name}'s ranks to be gone")
    except AssertionError as e:
        job.problems.append(str(e))
    if not (job.result / f"snapshot_iter_{AT}.rank1.npz").exists():
        job.problems.append(f"no snapshot of iteration {AT}")


def resumed_bit_for_bit(job: Job, reference) -> None:
    if job.state() != "COMPLETED":
        job.problems.append(f"requeued, it ended {job.state()}\n--- out\n"
                            f"{job.text('out')[-3000:]}\n--- err\n{job.text()[-3000:]}")
        return
    resumed = [int(i) for i in re.findall(r"resumed from iteration (\d+)", job.text("out"))]
    if not resumed or resumed[-1] < AT:
        job.problems.append(f"requeued, it did not resume from {AT} or later\n"
                            f"{job.text('out')[-3000:]}")
    elif models(job.result) != reference:
        job.problems.append("requeued, it did not end as the uninterrupted run, bit for bit")


ROUNDS = (("raise", "kill", "scancel"), ("cut",))


@pytest.fixture(scope="module")
def outcomes(slurm, tmp_path_factory):
    """``outcome(case)``: the jobs of ``case``, each with its ``problems``, played in
    rounds (raise, kill and scancel side by side; then cut), the time-limit jobs and the
    uninterrupted run from the start, on h3 and h4."""
    use = launchers()
    if not use:
        pytest.skip("needs at least one MPI venv (make venv-openmpi venv-mpich)")
    for launcher in use:
        launcher.mpi.check_library()
    folder = tmp_path_factory.mktemp("slurm-failures")
    reference = Job(slurm, folder, "reference", use[0], "h3,h4", 5, 0.0)
    reference.marker.unlink()
    # Paced 4 s an iteration past 40: still training when the limit (checked every 30 s by
    # slurmctld) ends it, 120 to 150 s after its start.
    background = [Job(slurm, folder, "timelimit", launcher, "h3,h4", 2, 4.0)
                  for launcher in use]
    watcher = Watcher(slurm, background)
    played: Dict[str, List[Job]] = {}

    def reference_models():
        wait_for([reference], lambda j: j.state() not in RUNNING + ("COMPLETING",), 300,
                 "the uninterrupted run")
        assert reference.state() == "COMPLETED", reference.text()
        return models(reference.result)

    def play(cases):
        jobs = [Job(slurm, folder, case, launcher, "h1,h2", 5, 1.0)
                for case in cases for launcher in use]
        watch = Watcher(slurm, jobs)
        acted: Dict[str, float] = {}
        try:
            wait_for(jobs, Job.started, 300, "the jobs to start training")
            for case in cases:
                acted.update(act(case, [j for j in jobs if j.case == case]))
            limit = max(bound_of(j.case, j) for j in jobs) + 60
            wait_for(jobs, lambda j: j.ended is not None, limit, "the jobs to end")
            if "cut" in cases:  # the cut-off host's ranks end on their own too
                wait_for(jobs, lambda j: 1 not in j.ranks(), 30, "rank 1 on h2 to end")
        finally:
            watch.stop.set()
            if "cut" in cases:
                Cluster.reconnect(2)
        for job in jobs:
            check(slurm, job, acted)
        if "cut" in cases:
            slurm.wait_idle([2], 60)
        requeue_and_finish(slurm, jobs)
        expected = reference_models()
        for job in jobs:
            resumed_bit_for_bit(job, expected)
        return jobs

    def outcome(case):
        if case == "timelimit":
            if case not in played:
                wait_for(background, lambda j: j.ended is not None, 300,
                         "the time limits to pass")
                for job in background:
                    check(slurm, job, {})
                requeue_and_finish(slurm, background)
                for job in background:
                    resumed_bit_for_bit(job, reference_models())
                played[case] = background
            return played[case]
        if case not in played:
            cases = next(r for r in ROUNDS if case in r)
            jobs = play(cases)
            for c in cases:
                played[c] = [j for j in jobs if j.case == c]
        return played[case]

    yield outcome
    watcher.stop.set()
    slurm.cancel_all()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", ["raise", "kill", "scancel", "cut", "timelimit"])
def test_a_failure_ends_the_job_in_time_cause_first_and_a_requeued_job_resumes(
        outcomes, case):
    jobs = outcomes(case)
    assert jobs and not any(j.problems for j in jobs), "\n\n".join(
        f"{j.name}: " + "\n".join(j.problems) for j in jobs if j.problems)
