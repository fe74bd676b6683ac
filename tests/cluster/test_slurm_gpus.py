"""GPUs under Slurm, without a GPU: the device mnpar gives each rank from what Slurm set.

Each node of the test Slurm has two pretend GPUs (``_slurm.py``): Slurm hands
them out and sets ``CUDA_VISIBLE_DEVICES`` as for real ones.
``scripts/gpus.py`` reports, per rank, the device that
``mnpar.communicators.gpu_index`` picks and its name in that variable: every
rank of a node must get a device of its own, whether Slurm shows each task its
own GPU (``--gpus-per-task=1``) or every task all of the node's
(``--gpus-per-node=2``), under ``srun`` and under hydra's ``mpiexec`` in an
allocation. The last case is the trap the docs warn of: an ``mpiexec`` in an
allocation asked for ``--gpus-per-task`` starts one proxy per node, which gets
one task's GPU, so both ranks of a node see the same single device.
"""
import os

import pytest
from _hosts import ROOT, results
from _mpis import LAUNCHERS

SCRIPT = os.path.join(ROOT, "tests", "cluster", "scripts", "gpus.py")


def run(slurm, name, options):
    launcher = LAUNCHERS[name]
    reason = launcher.mpi.unavailable()
    if reason:
        pytest.skip(f"needs {reason}")
    out = slurm.run_ok(launcher.command(2, 2, [launcher.mpi.python, SCRIPT],
                                        ["-w", "h1,h2", *options]),
                       timeout=180, env=slurm.env(**launcher.mpi.env()))
    found = results(out)
    assert [r["rank"] for r in found] == [0, 1, 2, 3], out
    assert [r["host"] for r in found] == ["h1", "h1", "h2", "h2"], found
    return found


@pytest.mark.parametrize("name, options, visible", [
    ("srun-pmix/openmpi", ["--gpus-per-task=1"], ["0", "1", "0", "1"]),
    ("srun-pmi2/mpich", ["--gpus-per-node=2"], ["0,1"] * 4),
    ("mpiexec/mpich-wheel", ["--gpus-per-node=2"], ["0,1"] * 4),
], ids=["srun-gpus-per-task", "srun-gpus-per-node", "mpiexec-gpus-per-node"])
def test_every_rank_of_a_node_gets_a_gpu_of_its_own(slurm, name, options, visible):
    found = run(slurm, name, options)
    assert [r["visible"] for r in found] == visible, found
    for r in found:
        assert r["index"] < len(r["visible"].split(",")), r
    assert len({(r["host"], r["name"]) for r in found}) == 4, found


def test_mpiexec_with_gpus_per_task_gives_a_nodes_ranks_one_gpu(slurm):
    found = run(slurm, "mpiexec/mpich-wheel", ["--gpus-per-task=1"])
    assert len({(r["host"], r["name"]) for r in found}) == 2, found  # shared: the trap
