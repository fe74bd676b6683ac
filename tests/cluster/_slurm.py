"""Slurm on the test hosts: a controller on h0 and one ``slurmd`` per compute host.

The configuration is written at run time into a directory of its own (the
hosts as nodes, the machine's cores as each node's CPUs, two pretend GPUs per
node, no accounting daemon, ``auth/none`` so no ``munged``), and every daemon
runs on its host through ``host.sh`` (the host's network namespace and name)::

    h0  10.77.0.10  slurmctld; the login host: srun, salloc, sbatch, scancel run here
    h1  10.77.0.11  slurmd     NodeName=h1 CPUs=<cores> Gres=gpu:2
    h2  10.77.0.12  slurmd     ...

Each daemon listens only inside its host's namespace: nothing outside the
test hosts' addresses is used. The hosts share one file system and one
``/tmp``, where a cluster has one per node: each node reads its own copy of
the configuration, whose ``mpi.conf`` gives PMIx a temporary directory of
that node's own (two nodes' ``slurmstepd`` would otherwise make the same
``/tmp/spmix_appdir_0_<job>.<step>``). A node's pretend GPUs are links to
``/dev/null`` named ``nvidia0`` and ``nvidia1``: Slurm hands them out and
sets ``CUDA_VISIBLE_DEVICES`` as for real ones.

Times chosen for tests: ``KillWait=5`` (from ``SIGTERM`` to ``SIGKILL`` at a
time limit or ``scancel``; 30 s by default) and ``SlurmdTimeout=30`` (a node
silent that long is set DOWN, its jobs ended or requeued; 300 s by default),
past mnpar's 20 s heartbeat limit, so that mnpar finds a cut-off host first,
as on a cluster. Each core may be given to up to four jobs at once
(``OverSubscribe=FORCE:8``), so that the failure tests run their jobs side by
side. Debian 12's packages: ``slurmctld``,
``slurmd`` and ``slurm-client`` 22.05, whose ``slurm-wlm-basic-plugins``
holds both ``mpi_pmi2.so`` and ``mpi_pmix.so``.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import _hosts

BINARIES = ("slurmctld", "slurmd", "srun", "salloc", "sbatch", "scontrol", "scancel")
PACKAGES = "Debian's slurmctld slurmd slurm-client (make cluster-packages, as root)"
KILL_WAIT = 5
SLURMD_TIMEOUT = 30
GPUS_PER_NODE = 2


def unavailable() -> Optional[str]:
    """What this machine lacks for Slurm on the test hosts, or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm's {', '.join(missing)} ({PACKAGES})"
    if shutil.which("unshare") is None:
        return "unshare (util-linux)"
    return None


def config(n: int, cpus: int, directory: str) -> str:
    """slurm.conf for nodes h1..hn of ``cpus`` CPUs each, state and logs in ``directory``."""
    nodes = "".join(f"NodeName={_hosts.name(i)} NodeAddr={_hosts.address(i)} CPUs={cpus} "
                    f"Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN\n" for i in range(1, n + 1))
    return f"""\
# Written by tests/cluster/_slurm.py for the test hosts; removed after the run.
ClusterName=mnpar
SlurmctldHost={_hosts.name(0)}({_hosts.address(0)})
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={directory}/state
SlurmdSpoolDir={directory}/spool/%n
SlurmctldPidFile={directory}/slurmctld.pid
SlurmdPidFile={directory}/slurmd-%n.pid
SlurmctldLogFile={directory}/log/slurmctld.log
SlurmdLogFile={directory}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
KillWait={KILL_WAIT}
SlurmdTimeout={SLURMD_TIMEOUT}
InactiveLimit=0
MinJobAge=600
GresTypes=gpu
{nodes}PartitionName=test Nodes=ALL Default=YES MaxTime=30 State=UP OverSubscribe=FORCE:8
"""


class Slurm:
    """Slurm over ``cluster``'s hosts; ``up`` starts it, ``down`` (always called) stops it."""

    def __init__(self, cluster: "_hosts.Cluster") -> None:
        self.cluster = cluster
        self.n = cluster.n
        self.dir = ""
        self.daemons: List[subprocess.Popen] = []

    def __enter__(self) -> "Slurm":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def conf(self, host: int = 0) -> str:
        """Host ``host``'s copy of slurm.conf (h0's for the commands run on h0)."""
        return os.path.join(self.dir, "etc", _hosts.name(host), "slurm.conf")

    def up(self, timeout: float = 60) -> None:
        """Writes the configuration, starts the daemons, waits until every node is idle."""
        reason = unavailable()
        if reason:
            raise _hosts.Unavailable(f"needs {reason}")
        self.dir = tempfile.mkdtemp(prefix="mnpar-slurm-")
        try:
            self._write()
            self._start(0, ["slurmctld", "-D", "-f", self.conf(0)])
            for i in range(1, self.n + 1):
                self._start(i, ["slurmd", "-D", "-f", self.conf(i)])
            self.wait_idle(range(1, self.n + 1), timeout)
        except BaseException as e:
            logs = self.logs()
            self.down()
            raise RuntimeError(f"Slurm did not start on the test hosts: {e}\n{logs}") from e

    def _write(self) -> None:
        cpus = max(2, os.cpu_count() or 1)
        text = config(self.n, cpus, self.dir)
        for sub in ("state", "log", "dev"):
            os.makedirs(os.path.join(self.dir, sub))
        for g in range(GPUS_PER_NODE):
            os.symlink("/dev/null", os.path.join(self.dir, "dev", f"nvidia{g}"))
        for i in range(0, self.n + 1):
            host = _hosts.name(i)
            etc = os.path.join(self.dir, "etc", host)
            os.makedirs(etc)
            os.makedirs(os.path.join(self.dir, "spool", host))
            os.makedirs(os.path.join(self.dir, "pmix", host))
            files = {
                "slurm.conf": text,
                "gres.conf": f"AutoDetect=off\nName=gpu File={self.dir}/dev/nvidia"
                             f"[0-{GPUS_PER_NODE - 1}]\n",
                # No cgroups: the hosts' /sys has none mounted; nothing here needs one.
                "cgroup.conf": f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={self.dir}/cgroup\n",
                "mpi.conf": f"PMIxCliTmpDirBase={self.dir}/pmix/{host}\n",
            }
            for name, content in files.items():
                with open(os.path.join(etc, name), "w") as f:
                    f.write(content)
        os.makedirs(os.path.join(self.dir, "cgroup"))

    def _start(self, host: int, argv: List[str]) -> None:
        log = open(os.path.join(self.dir, "log", f"{argv[0]}-{_hosts.name(host)}.out"), "w")
        proc = subprocess.Popen([_hosts.HOST_SH, _hosts.name(host), *argv], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=self.env())
        log.close()
        self.daemons.append(proc)
        _hosts.DAEMONS.add(proc.pid)

    def down(self) -> None:
        """Stops every daemon (SIGTERM, then SIGKILL) and removes the directory; the logs
        are kept in ``build/slurm-logs``."""
        for proc in self.daemons:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in self.daemons:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _hosts.DAEMONS.discard(proc.pid)
        self.daemons = []
        if self.dir:
            # The daemons' logs outlive the run, for a failure's post-mortem.
            kept = os.path.join(_hosts.ROOT, "build", "slurm-logs")
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(os.path.join(self.dir, "log"), kept, dirs_exist_ok=True)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def logs(self, tail: int = 30) -> str:
        """The last lines of every daemon's log, for a failure's message."""
        out = []
        folder = os.path.join(self.dir, "log")
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            with open(os.path.join(folder, name), errors="replace") as f:
                lines = f.read().splitlines()[-tail:]
            out.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(out)

    def env(self, **extra: str) -> Dict[str, str]:
        """The test hosts' environment (``Cluster.env``) and this Slurm's configuration."""
        env = {k: v for k, v in _hosts.Cluster.env(**extra).items() if not k.startswith("SLURM")}
        env["SLURM_CONF"] = self.conf(0)
        env.update({k: v for k, v in extra.items() if k.startswith("SLURM")})
        return env

    @staticmethod
    def on(host: int, argv: Sequence[str]) -> List[str]:
        """``argv`` run on test host ``host`` under its name (``host.sh``)."""
        return [_hosts.HOST_SH, _hosts.name(host), *argv]

    def run(self, argv: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None,
            cwd: Optional[str] = None, stdin: Optional[str] = None
            ) -> Tuple[Optional[int], str, str]:
        """Runs ``argv`` on the login host h0: ``(returncode, stdout, stderr)``; past
        ``timeout`` s it is killed with its jobs (``scancel``) and the returncode is None."""
        proc = subprocess.Popen(self.on(0, argv), cwd=cwd or _hosts.ROOT, text=True,
                                env=self.env() if env is None else env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
            return proc.returncode, out, err
        except BaseException as e:
            os.killpg(proc.pid, signal.SIGKILL)
            self.cancel_all()
            out, err = proc.communicate()
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            return None, out, err

    def run_ok(self, argv: Sequence[str], timeout: float = 60, **kwargs) -> str:
        """Runs ``argv`` on h0 to its end and returns its stdout, else an AssertionError."""
        code, out, err = self.run(argv, timeout, **kwargs)
        if code != 0:
            what = f"killed after {timeout} s: a hang?" if code is None else f"exit {code}"
            raise AssertionError(f"{' '.join(argv)}: {what}\n--- stdout\n{out}\n"
                                 f"--- stderr\n{err}")
        return out

    def scontrol(self, *args: str) -> str:
        return self.run_ok(["scontrol", *args], timeout=30)

    def job(self, job_id: int) -> Dict[str, str]:
        """``scontrol show job``'s fields of ``job_id`` (``JobState``, ``ExitCode``...)."""
        fields: Dict[str, str] = {}
        for word in self.scontrol("-o", "show", "job", str(job_id)).split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def jobs(self) -> Dict[int, Dict[str, str]]:
        """Every job Slurm knows: ``{id: fields}``, in one call."""
        found: Dict[int, Dict[str, str]] = {}
        for line in self.scontrol("-o", "show", "job").splitlines():
            fields: Dict[str, str] = {}
            for word in line.split():
                key, _, value = word.partition("=")
                fields.setdefault(key, value)
            if "JobId" in fields:
                found[int(fields["JobId"])] = fields
        return found

    def wait_job(self, job_id: int, timeout: float,
                 states: Sequence[str] = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                          "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
                 ) -> Tuple[str, float]:
        """Polls until the job is in one of ``states``: ``(state, monotonic time seen)``."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job(job_id)["JobState"]
            if state in states:
                return state, time.monotonic()
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {state} after {timeout} s\n"
                                     f"{self.logs()}")
            time.sleep(0.1)

    def cancel_all(self) -> None:
        subprocess.run(self.on(0, ["scancel", "--full", "--user", "root"]), env=self.env(),
                       capture_output=True)

    def wait_idle(self, hosts: Sequence[int], timeout: float) -> None:
        """Waits until the nodes ``hosts`` are idle (after ``scontrol update ... resume``
        where one was down)."""
        names = ",".join(_hosts.name(i) for i in hosts)
        deadline = time.monotonic() + timeout
        while True:
            code, out, _ = self.run(["sinfo", "-h", "-N", "-n", names, "-o", "%N %t"], 30)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if code == 0 and len(states) == len(hosts) and \
                    all(s == "idle" for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes not idle after {timeout} s: {states}")
            time.sleep(0.2)
