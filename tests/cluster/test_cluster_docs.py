"""Every command of docs/cluster.rst, and of docs/installation.rst's "Using a system MPI
instead", runs as written on the test hosts.

The commands are read from the pages' console blocks (``$ `` lines; a
trailing backslash continues a line; ``# ...`` comments dropped). ``RUNS``
says how each one is run, and a test fails when a page has a command it does
not know, or it knows one the pages no longer have. The runs:

* a page's launch line runs in a folder of its own, where ``.venv`` is the
  venv of the MPI it is for (a link: the checkout's ``.venv``,
  ``.venv-openmpi`` or ``.venv-mpich``), ``check_cluster.py`` is the page's
  program and ``examples`` the checkout's; with that venv first on ``PATH``,
  as if activated; on the login host h0 (Slurm's, and an ssh launcher's:
  ``HYDRA_LAUNCHER_EXEC`` and ``OMPI_MCA_plm_rsh_agent`` name
  ``netns_launcher.sh``, where a cluster has ssh, and the test hosts answer
  to ``node1``, ``node2`` too); what ``check_cluster.py`` prints must show
  every rank where the command put it;
* ``salloc`` then ``mpiexec``: salloc's shell reads the second line;
* the batch script runs under ``sbatch`` as the page shows it, less
  ``--gpu`` where there is no GPU (Slurm's pretend GPUs are still handed
  out); its output must be where the page says;
* the venv steps of docs/installation.rst are the Makefile's (``make -n``
  prints each, for ``.venv-openmpi``, with ``MPICC`` and ``CFLAGS``), and
  ``make test-cluster`` runs them before these tests.
"""
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from _hosts import HOST_SH, LAUNCHER, ROOT, Cluster
from _mpis import MPIS

sys.path.insert(0, os.path.join(ROOT, "tests"))
# isort: split
from test_docs_programs import parse  # noqa: E402  the pages' code blocks

pytestmark = pytest.mark.timeout(600)
CLUSTER = os.path.join(ROOT, "docs", "cluster.rst")
INSTALLATION = os.path.join(ROOT, "docs", "installation.rst")
SECTION = "Using a system MPI instead"


def blocks(page, section=None):
    with open(page) as f:
        text = f.read()
    if section:
        start = text.index(f"{section}\n")
        end = re.search(r"\n[^\n]+\n-{3,}\n", text[start + len(section) + 1:])
        text = text[start:start + len(section) + 1 + (end.start() if end else len(text))]
    found, _ = parse(os.path.relpath(page, ROOT), text)
    return found


def commands(page, section=None):
    """``(command, output lines)`` of every ``$`` line of the page's console blocks."""
    found = []
    for block in blocks(page, section):
        if block.language != "console":
            continue
        lines = block.text.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.startswith("$ "):
                continue
            command = line[2:]
            while command.endswith("\\") and i < len(lines):
                command = command[:-1] + " " + lines[i].strip()
                i += 1
            output = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith("$ ") \
                    and not lines[i].startswith("("):
                output.append(lines[i].strip())
                i += 1
            command = re.sub(r"\s+#.*$", "", command)
            found.append((re.sub(r"\s+", " ", command).strip(), output))
    return found


def program(name="check_cluster.py"):
    parts = [b.text for b in blocks(CLUSTER) if b.marker == ("program", name)]
    assert parts, f"docs/cluster.rst has no program {name}"
    return "".join(parts)


def batch_script():
    found = [b.text for b in blocks(CLUSTER) if b.language == "bash" and "#SBATCH" in b.text]
    assert len(found) == 1, found
    return found[0]


VERSION = '.venv/bin/python -c "from mpi4py import MPI; print(MPI.Get_library_version())"'
SRUN = "srun --mpi={} -N 2 --ntasks-per-node=2 .venv/bin/python check_cluster.py"
VENV_STEPS = [
    "python3.11 -m venv .venv",
    'export PIP_CONSTRAINT="$PWD/constraints.txt $PWD/constraints-numpy1.txt"',
    ".venv/bin/python -m pip install setuptools wheel numpy",
    ".venv/bin/python -m pip install --no-cache-dir --no-binary mpi4py mpi4py",
    '.venv/bin/python -m pip install --no-build-isolation "chainer==7.8.1"',
    '.venv/bin/python -m pip install --no-build-isolation -e ".[examples,dev]"',
]
# Each command of the pages, and the test that runs it.
RUNS = {
    VERSION: "test_every_venv_names_its_mpi",
    "cat hosts": "test_a_host_file_with_hydra_and_with_mpirun",
    "mpiexec -f hosts -n 4 .venv/bin/python check_cluster.py":
        "test_a_host_file_with_hydra_and_with_mpirun",
    "mpirun --hostfile hosts -n 4 .venv/bin/python check_cluster.py":
        "test_a_host_file_with_hydra_and_with_mpirun",
    SRUN.format("pmix"): "test_srun_with_each_plugin",
    SRUN.format("pmi2"): "test_srun_with_each_plugin",
    "salloc -N 2 --ntasks-per-node=2": "test_salloc_then_mpiexec",
    "mpiexec -n 4 .venv/bin/python check_cluster.py": "test_salloc_then_mpiexec",
    "mpiexec -iface mnparbr0 -launcher ssh -launcher-exec tests/cluster/netns_launcher.sh "
    "-hosts h1:2,h2:2 -n 4 .venv/bin/python check_cluster.py": "test_the_test_hosts_own_line",
    "which mpicc mpiexec": "test_the_system_mpi_steps_are_the_makefiles",
    **{step: "test_the_system_mpi_steps_are_the_makefiles" for step in VENV_STEPS},
    "make venv-openmpi": "test_the_system_mpi_steps_are_the_makefiles",
    "make venv-mpich": "test_the_system_mpi_steps_are_the_makefiles",
    "make test-system-mpi": "test_the_system_mpi_steps_are_the_makefiles",
}


def test_every_command_of_the_pages_is_run_here():
    found = [c for c, _ in commands(CLUSTER)] + [c for c, _ in commands(INSTALLATION, SECTION)]
    assert set(found) == set(RUNS), (f"not run here: {sorted(set(found) - set(RUNS))}; "
                                     f"no longer on the pages: {sorted(set(RUNS) - set(found))}")
    tests = {name for name in globals() if name.startswith("test_")}
    assert set(RUNS.values()) <= tests


def need(mpi):
    reason = mpi.unavailable()
    if reason:
        pytest.skip(f"needs {reason}")


def folder(tmp_path, mpi):
    """The page's working folder for ``mpi``: ``.venv``, ``check_cluster.py``, ``examples``,
    ``tests``; its ``bin`` has the plain names of the MPI's launchers."""
    (tmp_path / ".venv").symlink_to(os.path.join(ROOT, mpi.venv))
    (tmp_path / "examples").symlink_to(os.path.join(ROOT, "examples"))
    (tmp_path / "tests").symlink_to(os.path.join(ROOT, "tests"))
    (tmp_path / "check_cluster.py").write_text(program())
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for plain in ("mpiexec", "mpirun"):
        (bin_ / plain).symlink_to(shutil.which(mpi.mpiexec) if mpi.name == "openmpi"
                                  else mpi.launcher())
    return tmp_path


def page_env(base, mpi, where):
    env = dict(base, **mpi.env(), HYDRA_LAUNCHER="ssh", HYDRA_LAUNCHER_EXEC=LAUNCHER,
               OMPI_MCA_plm_rsh_agent=LAUNCHER)
    env["PATH"] = f"{where}/.venv/bin:{where}/bin:{env['PATH']}"
    return env


def placed(out, hosts, per_node):
    """Checks check_cluster.py's lines: ``hosts`` x ``per_node`` ranks, in blocks."""
    n = len(hosts) * per_node
    assert f"{n} ranks on {len(hosts)} node(s)" in out, out
    rows = re.findall(r"^rank (\d+): (\S+), node (\d+), local rank (\d+) of (\d+), GPU (\S+)$",
                      out, re.M)
    assert [int(r[0]) for r in rows] == list(range(n)), out
    for rank, host, node, local, size, _ in rows:
        r = int(rank)
        assert (host, int(node), int(local), int(size)) == (
            hosts[r // per_node], r // per_node, r % per_node, per_node), out


def test_every_venv_names_its_mpi(cluster):
    for mpi in MPIS.values():
        if mpi.unavailable():
            continue
        env = {k: v for k, v in Cluster.env().items() if not k.startswith("UCX_")}
        done = subprocess.run(VERSION.replace(".venv/", f"{mpi.venv}/"), shell=True, cwd=ROOT,
                              capture_output=True, text=True, timeout=60, env=env)
        assert re.match(mpi.library, done.stdout), (mpi.name, done.stdout, done.stderr)


@pytest.mark.parametrize("plugin, name", [("pmix", "openmpi"), ("pmi2", "mpich")])
def test_srun_with_each_plugin(slurm, tmp_path, plugin, name):
    mpi = MPIS[name]
    need(mpi)
    where = folder(tmp_path, mpi)
    out = slurm.run_ok(SRUN.format(plugin).split(), cwd=str(where), timeout=180,
                       env=page_env(slurm.env(), mpi, where))
    hosts = re.findall(r"^rank \d+: (\S+),", out, re.M)
    placed(out, sorted(set(hosts)), 2)


@pytest.mark.parametrize("name", ["mpich-wheel", "openmpi"])
def test_salloc_then_mpiexec(slurm, tmp_path, name):
    mpi = MPIS[name]
    need(mpi)
    where = folder(tmp_path, mpi)
    out = slurm.run_ok(["salloc", "-N", "2", "--ntasks-per-node=2"], cwd=str(where),
                       timeout=180, env=dict(page_env(slurm.env(), mpi, where),
                                             SHELL="/bin/bash"),
                       stdin="mpiexec -n 4 .venv/bin/python check_cluster.py\n")
    hosts = re.findall(r"^rank \d+: (\S+),", out, re.M)
    placed(out, sorted(set(hosts)), 2)


@pytest.mark.parametrize("name", ["mpich-wheel", "openmpi"])
def test_a_host_file_with_hydra_and_with_mpirun(cluster, tmp_path, name):
    mpi = MPIS[name]
    need(mpi)
    where = folder(tmp_path, mpi)
    cat, = [(c, out) for c, out in commands(CLUSTER) if c == "cat hosts"]
    lines = cat[1] if name == "mpich-wheel" else [
        f"{line.split(':')[0]} slots={line.split(':')[1]}" for line in cat[1]]
    (where / "hosts").write_text("\n".join(lines) + "\n")
    command = ("mpiexec -f hosts -n 4 .venv/bin/python check_cluster.py" if name == "mpich-wheel"
               else "mpirun --hostfile hosts -n 4 .venv/bin/python check_cluster.py")
    done = subprocess.run([HOST_SH, "h0", "bash", "-c", f"cat hosts && {command}"],
                          cwd=str(where), capture_output=True, text=True, timeout=180,
                          env=page_env(Cluster.env(), mpi, where))
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.startswith("\n".join(lines)), done.stdout
    placed(done.stdout, ["h1", "h2"], 2)


def test_the_test_hosts_own_line(cluster, tmp_path):
    mpi = MPIS["mpich-wheel"]
    where = folder(tmp_path, mpi)
    command, = [c for c in RUNS if c.startswith("mpiexec -iface")]
    done = subprocess.run(command.split(), cwd=str(where), capture_output=True, text=True,
                          timeout=180, env=page_env(Cluster.env(), mpi, where))
    assert done.returncode == 0, (done.stdout, done.stderr)
    placed(done.stdout, ["h1", "h2"], 2)


def test_the_batch_script_runs_and_its_output_is_where_the_page_says(slurm, tmp_path):
    mpi = MPIS["openmpi"]
    need(mpi)
    where = folder(tmp_path, mpi)
    script = batch_script()
    assert "--mpi=pmix" in script and "--resume auto" in script
    if not os.path.exists("/dev/nvidia0"):  # no GPU: the same run on the CPU
        script = script.replace(" --gpu ", " ")
    (where / "mlp.sbatch").write_text(script)
    job = slurm.run_ok(["sbatch", "--parsable", "mlp.sbatch"], cwd=str(where),
                       env=page_env(slurm.env(MPLBACKEND="Agg"), mpi, where)).strip()
    state, _ = slurm.wait_job(int(job), 400)
    out, err = where / f"mlp-{job}.out", where / f"mlp-{job}.err"
    assert state == "COMPLETED", (state, out.read_text(), err.read_text())
    text = out.read_text()
    assert "starting from iteration 0" in text and "validation accuracy" in text, text
    assert "models: result/mlp/model_rank{0,1}.npz" in text, text
    assert not re.search(r"Traceback|error:", err.read_text()), err.read_text()
    assert (where / "result" / "mlp" / "model_rank1.npz").exists()
    # Requeued, the job continues from its last snapshot: here, it has finished. (Not in
    # the second it ended: slurmd refuses a job whose credential it revoked in the second
    # the new one was made, "Job credential revoked".)
    time.sleep(2)
    slurm.scontrol("requeue", job)
    slurm.scontrol("update", f"JobId={job}", "StartTime=now")
    state, _ = slurm.wait_job(int(job), 400)
    assert state == "COMPLETED", (slurm.scontrol("show", "job", job), out.read_text(),
                                  err.read_text())
    assert re.search(r"resumed from iteration \d+", out.read_text()), out.read_text()


def test_the_system_mpi_steps_are_the_makefiles():
    found = [c for c, _ in commands(INSTALLATION, SECTION)]
    assert found[0] == "which mpicc mpiexec"
    if shutil.which("mpicc") and shutil.which("mpiexec"):
        done = subprocess.run(["bash", "-c", found[0]], capture_output=True, text=True)
        assert done.returncode == 0 and len(done.stdout.split()) == 2, done
    steps = found[1:found.index(VERSION)]
    assert steps == VENV_STEPS
    dry = subprocess.run(["make", "-n", "-B", "PYTHON=python3.11", ".venv-openmpi/.installed"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    made = [re.sub(r"\s+", " ", line.strip()) for line in dry.stdout.splitlines()]
    for step in steps:
        if step.startswith("export PIP_CONSTRAINT"):
            continue  # the Makefile exports it for every recipe
        want = step.replace(".venv/", ".venv-openmpi/").replace(" .venv", " .venv-openmpi")
        want = want.replace(" -m pip install ", " -m pip install -q ")
        if "--no-binary mpi4py" in step:
            want = 'MPICC=mpicc.openmpi CFLAGS="-O0" ' + want
        assert want in made, (want, made)
    assert VERSION.split(" -c ")[0].replace(".venv", ".venv-openmpi") in dry.stdout
    for target in ("venv-openmpi", "venv-mpich", "test-system-mpi"):
        assert subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True,
                              timeout=60).returncode == 0, target
