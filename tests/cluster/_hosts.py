"""Test hosts on one machine: network namespaces h1, h2, ... joined by a bridge.

Each test host is a Linux network namespace with a network stack of its own,
so MPI ranks on different hosts talk over TCP through veth pairs, as on a
cluster, while ranks on one host share memory::

    root namespace                            namespace mnpar-hI (test host hI)
    bridge mnparbr0 10.77.0.1/24 -- mnpar-hI ==veth== mnpar0 10.77.0.(10+I)/24, lo

Host h0 (10.77.0.10) is the head node: Slurm's controller and the login
host where jobs are submitted (``_slurm.py``); ranks run on h1, h2, ...
``host.sh HOST CMD...`` runs a command on a host under the host's own name.

hydra (the mpich wheel's ``mpiexec``) starts its proxies through
``netns_launcher.sh`` (``-launcher ssh -launcher-exec``), which runs them in
the host's namespace, and listens on the bridge (``-iface mnparbr0``). Names
h1, h2, ... resolve inside the test hosts through ``/etc/netns/mnpar-hI/hosts``,
which ``ip netns exec`` mounts over ``/etc/hosts``: the machine's own
``/etc/hosts`` is never touched. UCX, the wheel's default netmod, sees one
machine (one boot id) and would move data between hosts through shared
memory; ``UCX_TLS=tcp`` keeps it on the veths (``Cluster.env``).

Everything it creates is named ``mnpar...``; a lock file keeps two runs apart,
and each run first removes what a killed run left (``remove_leftovers``).
``python tests/cluster/_hosts.py down`` does that by hand. Usage::

    with Cluster(2) as hosts:                       # root only; see unavailable()
        code, out, err = hosts.run([2, 2], ["python", "script.py"], timeout=60)
"""
import atexit
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Collection, Dict, List, Optional, Sequence, Set, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LAUNCHER = os.path.join(HERE, "netns_launcher.sh")
HOST_SH = os.path.join(HERE, "host.sh")  # runs a command on a host, under its name
BRIDGE = "mnparbr0"
SUBNET = "10.77.0"
BRIDGE_ADDRESS = f"{SUBNET}.1"
PREFIX = "mnpar-"  # namespace mnpar-hI, and the root namespace's end of its veth
INNER = "mnpar0"  # the veth end inside every host
NETNS_ETC = "/etc/netns"
LOCK = os.path.join(tempfile.gettempdir(), "mnpar-cluster.lock")
MAX_HOSTS = 99  # what netns_launcher.sh accepts
# Launch state of an enclosing MPI job, and mnpar's simulated nodes: never passed on.
DROPPED = ("PMI_", "HYDRA_", "MPIR_", "OMPI_", "UCX_", "FI_")
SIMULATED_NODES = "MNPAR_RANKS_PER_NODE"


class Unavailable(RuntimeError):
    """Test hosts cannot be made here; the message says what is missing."""


def name(i: int) -> str:
    """Test host ``i``: ``h{i}`` (h0 the head node, h1, h2, ... the compute hosts)."""
    return f"h{i}"


def address(i: int) -> str:
    return f"{SUBNET}.{10 + i}"


def find_mpiexec() -> str:
    """The mpich wheel's ``mpiexec`` beside this Python, else ``MPIEXEC`` or the PATH's."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.environ.get("MPIEXEC"):
        return os.environ["MPIEXEC"]
    return beside if os.path.exists(beside) else (shutil.which("mpiexec") or "mpiexec")


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def unavailable() -> Optional[str]:
    """What this machine lacks for test hosts (``"root ..."``), or None."""
    if not sys.platform.startswith("linux"):
        return f"Linux network namespaces, not {sys.platform}"
    if shutil.which("ip") is None:
        return "the ip command (iproute2)"
    if os.geteuid() != 0:
        return "root, to create network namespaces"
    mpiexec = find_mpiexec()
    try:
        info = subprocess.run([mpiexec, "-info"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"MPICH's hydra mpiexec ({mpiexec}: {e})"
    if "HYDRA" not in info.stdout:
        return f"MPICH's hydra mpiexec, not {mpiexec}"
    for line in _ip("-4", "-o", "addr", "show").splitlines():
        fields = line.split()
        if fields[1] != BRIDGE and fields[3].startswith(f"{SUBNET}."):
            return f"{SUBNET}.0/24 free for test hosts, but {fields[1]} has {fields[3]}"
    return None


def _namespaces() -> List[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


# Processes that a timed-out run leaves alone: Slurm's daemons on the hosts (_slurm.py).
DAEMONS: Set[int] = set()


def _kill_namespace(ns: str, spare: Collection[int] = ()) -> None:
    """SIGKILLs every process in ``ns`` but ``spare`` and waits (up to 5 s) until none is
    left."""
    deadline = time.monotonic() + 5
    while True:
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).split()
                if int(p) not in spare]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def remove_leftovers() -> None:
    """Removes every namespace (and what runs there: Slurm's daemons too), link and hosts
    file of test hosts, and Slurm's run directories; call with the lock held."""
    ours = [ns for ns in _namespaces() if ns.startswith(f"{PREFIX}h")]
    for ns in ours:
        _kill_namespace(ns)
    for line in _ip("-o", "link", "show").splitlines():
        link = line.split(":")[1].strip().split("@")[0]
        if link == BRIDGE or link.startswith(PREFIX):
            _ip("link", "del", link, check=False)
    for ns in ours:
        _ip("netns", "del", ns, check=False)
    for entry in os.listdir(tempfile.gettempdir()):  # Slurm's run directories (_slurm.py)
        if entry.startswith("mnpar-slurm-"):
            shutil.rmtree(os.path.join(tempfile.gettempdir(), entry), ignore_errors=True)
    if os.path.isdir(NETNS_ETC):
        for entry in os.listdir(NETNS_ETC):
            if entry.startswith(f"{PREFIX}h"):
                shutil.rmtree(os.path.join(NETNS_ETC, entry), ignore_errors=True)
        if not os.listdir(NETNS_ETC):
            os.rmdir(NETNS_ETC)


class Cluster:
    """``n`` test hosts h1..hn and the head node h0; ``up`` makes them, ``down`` (always
    called) removes them."""

    def __init__(self, n: int) -> None:
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"n={n} test hosts: must be 1 to {MAX_HOSTS}")
        self.n = n
        self._lock: Optional[int] = None
        self._old_sigterm = None

    def __enter__(self) -> "Cluster":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self, lock_timeout: float = 300) -> None:
        """Takes the lock, removes leftovers, makes bridge and hosts; raises ``Unavailable``."""
        reason = unavailable()
        if reason:
            raise Unavailable(f"needs {reason}")
        self._take_lock(lock_timeout)
        atexit.register(self.down)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # so that down() runs
            self._old_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            remove_leftovers()
            self._make()
        except Exception as e:
            self.down()
            raise Unavailable(f"could not make test hosts here: {e}") from e

    def _take_lock(self, timeout: float) -> None:
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError as e:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise RuntimeError(f"another run has held {LOCK} for {timeout:.0f} s") from e
                time.sleep(0.5)
        self._lock = fd

    def _make(self) -> None:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        # node1, node2, ...: other names of h1, h2, ..., as docs/cluster.rst's host files say.
        hosts = "".join(f"{address(i)} {name(i)}{f' node{i}' if i else ''}\n"
                        for i in range(0, self.n + 1))
        for i in range(0, self.n + 1):
            ns = PREFIX + name(i)
            _ip("netns", "add", ns)
            _ip("link", "add", ns, "type", "veth", "peer", "name", INNER, "netns", ns)
            _ip("link", "set", ns, "master", BRIDGE, "up")
            _ip("-n", ns, "addr", "add", f"{address(i)}/24", "dev", INNER)
            _ip("-n", ns, "link", "set", INNER, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
            with open(os.path.join(NETNS_ETC, ns, "hosts"), "w") as f:
                f.write(f"127.0.0.1 localhost\n{BRIDGE_ADDRESS} {BRIDGE}\n{hosts}")

    def down(self) -> None:
        """Kills what runs on the hosts and removes them; safe to call twice."""
        if self._lock is None:
            return
        try:
            remove_leftovers()
        finally:
            os.close(self._lock)  # releases the lock
            self._lock = None
            atexit.unregister(self.down)
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
                self._old_sigterm = None

    @staticmethod
    def env(**extra: str) -> Dict[str, str]:
        """This environment for ranks on the hosts: no launch state, TCP between hosts."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(DROPPED) and k != SIMULATED_NODES}
        env.update(PYTHONUNBUFFERED="1", MNPAR_TIMEOUT="60", UCX_TLS="tcp",
                   UCX_NET_DEVICES=INNER)
        env.update(extra)
        return env

    def command(self, layout: Sequence[int], argv: Sequence[str]) -> List[str]:
        """``mpiexec`` running ``argv`` with ``layout[i]`` ranks on host ``i + 1``."""
        if not 1 <= len(layout) <= self.n or min(layout) < 1:
            raise ValueError(f"layout {list(layout)}: 1 to {self.n} hosts of at least 1 rank")
        hosts = ",".join(f"{name(i + 1)}:{k}" for i, k in enumerate(layout))
        return [find_mpiexec(), "-iface", BRIDGE, "-launcher", "ssh", "-launcher-exec",
                LAUNCHER, "-hosts", hosts, "-n", str(sum(layout)), *argv]

    def run(self, layout: Sequence[int], argv: Sequence[str], timeout: float,
            env: Optional[Dict[str, str]] = None) -> Tuple[Optional[int], str, str]:
        """``(returncode, stdout, stderr)``; past ``timeout`` s every rank is killed and
        the returncode is None."""
        proc = subprocess.Popen(self.command(layout, argv), cwd=ROOT, text=True,
                                env=self.env() if env is None else env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
            return proc.returncode, out, err
        except BaseException as e:  # past the timeout, or interrupted: kill every rank
            os.killpg(proc.pid, signal.SIGKILL)
            for i in range(1, self.n + 1):
                _kill_namespace(PREFIX + name(i), spare=DAEMONS)
            out, err = proc.communicate()
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            return None, out, err

    def run_ok(self, layout: Sequence[int], argv: Sequence[str], timeout: float = 60,
               env: Optional[Dict[str, str]] = None) -> str:
        """Runs ``argv`` to its end and returns its stdout; else an AssertionError with
        the whole output."""
        code, out, err = self.run(layout, argv, timeout, env)
        if code != 0:
            what = f"killed after {timeout} s: a hang?" if code is None else f"exit {code}"
            raise AssertionError(f"{' '.join(argv)} on hosts {list(layout)}: {what}\n"
                                 f"--- stdout\n{out}\n--- stderr\n{err}")
        return out

    @staticmethod
    def cut(i: int) -> None:
        """Cuts host ``i`` off the network (its veth's bridge end down)."""
        _ip("link", "set", PREFIX + name(i), "down")

    @staticmethod
    def reconnect(i: int, seconds: float = 20.0) -> None:
        """Sets host ``i``'s link up again and waits until it resolves the bridge's
        address: right after the link comes back its neighbour entries are still
        INCOMPLETE from the cut, and the next job would find "No route to host". A
        datagram to the bridge starts the resolution (the test hosts have no ping)."""
        ns = PREFIX + name(i)
        _ip("link", "set", ns, "up")
        _ip("-n", ns, "neigh", "flush", "all", check=False)
        poke = ("import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                f".sendto(b'', ('{BRIDGE_ADDRESS}', 9))")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", poke],
                           capture_output=True)
            state = _ip("-n", ns, "neigh", "show", BRIDGE_ADDRESS, check=False)
            if "REACHABLE" in state or "STALE" in state or "DELAY" in state:
                return
            time.sleep(0.2)
        raise AssertionError(f"test host {name(i)} did not resolve {BRIDGE_ADDRESS} within "
                             f"{seconds} s of its link coming back")

    @staticmethod
    def pids(i: int) -> List[int]:
        """The processes running on host ``i`` (in its namespace)."""
        return [int(p) for p in _ip("netns", "pids", PREFIX + name(i), check=False).split()]

    @staticmethod
    def sent_bytes(i: int) -> int:
        """Bytes host ``i`` has sent over its veth (the bridge's side received them)."""
        with open(f"/sys/class/net/{PREFIX}{name(i)}/statistics/rx_bytes") as f:
            return int(f.read())


def results(stdout: str) -> List[dict]:
    """The ``RESULT {json}`` lines the ranks printed, in rank order."""
    found = [json.loads(line[len("RESULT "):]) for line in stdout.splitlines()
             if line.startswith("RESULT ")]
    return sorted(found, key=lambda r: r["rank"])


def _exit_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # pytest ends the session and runs finalizers


if __name__ == "__main__":
    if sys.argv[1:] != ["down"]:
        sys.exit(f"usage: {sys.argv[0]} down   (removes test hosts a killed run left)")
    if os.geteuid() != 0:
        sys.exit("needs root")
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    remove_leftovers()
    print("test hosts removed")
