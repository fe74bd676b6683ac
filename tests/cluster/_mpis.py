"""The MPIs the cluster tests run, and how each is launched on the test hosts.

Three MPI libraries, each in a venv of its own with mpi4py built against it
(the Makefile's ``venv-openmpi`` and ``venv-mpich`` build the last two as
docs/installation.rst, "Using a system MPI instead", says)::

    name         venv            library                        launchers
    mpich-wheel  .venv           MPICH 5.0 (the mpich wheel)    its hydra mpiexec
    openmpi      .venv-openmpi   Open MPI 4.1 (Debian 12)       mpirun, srun --mpi=pmix
    mpich        .venv-mpich     MPICH 4.0 (Debian 12)          its hydra mpiexec, srun --mpi=pmi2

What each needs on the test hosts, beyond what a cluster needs (``env``):
both MPICHs move data with UCX, which sees one machine behind the hosts and
would go through shared memory between them (``UCX_TLS=tcp``); Open MPI
(ob1 over TCP: its UCX component takes only InfiniBand and RoCE devices)
needs nothing but ``OMPI_ALLOW_RUN_AS_ROOT`` where it runs as root. The
interface flags the docs give (``btl_tcp_if_include``, ``oob_tcp_if_include``)
are set to the test network, as a cluster with several networks needs.

The mpich wheel is not launched by ``srun``: under Slurm 22.05's
``--mpi=pmi2`` its PMI messages (its address exchange, with PMI-1 framing)
outgrow what slurmstepd reads, and start-up fails at random ("mpi/pmi2: value
not properly terminated in client request", then UCX "failed to unpack
address", or a hang); it has no PMIx at all. Under ``salloc``/``sbatch`` its
hydra ``mpiexec`` starts the ranks through its own PMI server.
"""
import os
import re
import shutil
import subprocess
from typing import Dict, List, NamedTuple, Optional, Sequence

from _hosts import INNER, ROOT, SUBNET

TEST_NETWORK = f"{SUBNET}.0/24"


class MPI(NamedTuple):
    name: str
    venv: str  # relative to the checkout
    library: str  # a regular expression for the start of MPI.Get_library_version()
    mpiexec: str  # the launcher's name on PATH (the wheel's: in the venv)
    srun: Optional[str]  # the srun --mpi plugin it works with, or None
    packages: str  # what provides it

    @property
    def python(self) -> str:
        return os.path.join(ROOT, self.venv, "bin", "python")

    def launcher(self) -> str:
        beside = os.path.join(ROOT, self.venv, "bin", self.mpiexec)
        return beside if os.path.exists(beside) else (shutil.which(self.mpiexec) or "")

    def env(self) -> Dict[str, str]:
        """What it needs on the test hosts (see the module's docstring)."""
        if self.name == "openmpi":
            env = {"OMPI_MCA_btl_tcp_if_include": TEST_NETWORK,
                   "OMPI_MCA_oob_tcp_if_include": TEST_NETWORK}
            if os.geteuid() == 0:
                env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            return env
        return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": INNER}

    def unavailable(self) -> Optional[str]:
        """Why this MPI cannot run here (its venv, its launcher), or None."""
        if not os.path.exists(self.python):
            return (f"{self.venv} ({self.library} with mpi4py built against it: make "
                    f"venv-{self.name}, after installing {self.packages})")
        if not self.launcher():
            return f"{self.mpiexec} ({self.packages})"
        return None

    def check_library(self) -> None:
        """Raises unless the venv's mpi4py runs on this MPI library."""
        done = subprocess.run([self.python, "-c", "from mpi4py import MPI; "
                               "print(MPI.Get_library_version())"],
                              capture_output=True, text=True, timeout=60,
                              env={k: v for k, v in os.environ.items()
                                   if not k.startswith(("PMI", "OMPI_", "PMIX"))})
        if not re.match(self.library, done.stdout):
            raise AssertionError(f"{self.python}: mpi4py runs on {done.stdout.strip()!r} "
                                 f"{done.stderr.strip()}, not {self.library}")


MPIS = {m.name: m for m in (
    MPI("mpich-wheel", ".venv", r"MPICH Version:\s+5\.", "mpiexec", None,
        "the mpich wheel (make install)"),
    MPI("openmpi", ".venv-openmpi", r"Open MPI v4\.", "mpirun.openmpi", "pmix",
        "Debian's openmpi-bin libopenmpi-dev"),
    MPI("mpich", ".venv-mpich", r"MPICH Version:\s+4\.", "mpiexec.mpich", "pmi2",
        "Debian's mpich libmpich-dev"),
)}


class Launcher(NamedTuple):
    """One way a job starts its ranks: ``srun`` itself, or an ``mpiexec`` inside the job."""

    name: str
    mpi: MPI
    srun: bool

    def inside(self, nodes: int, per_node: int, program: Sequence[str]) -> List[str]:
        """The command that starts ``nodes x per_node`` ranks of ``program`` in a job."""
        if self.srun:
            return ["srun", f"--mpi={self.mpi.srun}", "--kill-on-bad-exit=1", "-N", str(nodes),
                    f"--ntasks-per-node={per_node}", *program]
        return [self.mpi.launcher(), "-n", str(nodes * per_node), *program]

    def command(self, nodes: int, per_node: int, program: Sequence[str],
                options: Sequence[str] = ()) -> List[str]:
        """The same from the login host: srun itself, or the mpiexec inside ``salloc``;
        ``options`` go to srun or salloc (``-w h1,h2``)."""
        inside = self.inside(nodes, per_node, program)
        if self.srun:
            return [*inside[:2], *options, *inside[2:]]
        return ["salloc", "-N", str(nodes), f"--ntasks-per-node={per_node}", *options, *inside]


LAUNCHERS = {launcher.name: launcher for launcher in (
    Launcher("srun-pmi2/mpich", MPIS["mpich"], True),
    Launcher("srun-pmix/openmpi", MPIS["openmpi"], True),
    Launcher("mpiexec/mpich-wheel", MPIS["mpich-wheel"], False),
    Launcher("mpirun/openmpi", MPIS["openmpi"], False),
)}


def rank_of(environ: Dict[str, str]) -> Optional[int]:
    """A rank's MPI rank from its environment, whichever launcher started it."""
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if key in environ:
            return int(environ[key])
    return None
