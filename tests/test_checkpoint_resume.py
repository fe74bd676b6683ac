"""A resumed run continues from the same iteration with the same data order, at any
rank count and stage; the checkpoint lists and consolidates into one chainer npz that
chainer's own ``load_npz`` loads in one process; a rank killed mid-write leaves the
previous checkpoint whole.

The data order is every rank's alike: one iterator over the whole dataset
(``ResumableShuffleOrderSampler``), each rank taking its rows of the global
batch, so the iterator's state is a value every rank held alike and loads at
any rank count.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import chainer
import numpy as np
import pytest
from chainer.dataset import concat_examples
from sharded_models import Net

import mnpar
from mnpar.extensions import ResumableShuffleOrderSampler

BATCH = 12  # the global batch: 1, 2, 3 and 4 ranks take equal rows
HERE = os.path.dirname(__file__)


def dataset():
    rng = np.random.RandomState(0)
    return chainer.datasets.TupleDataset(rng.randn(48, 5), rng.randint(0, 3, 48).astype(np.int32))


def make_trainer(comm, stage, out, stop=6):
    model = Net()
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01), comm,
                                            stage=stage).setup(model)
    it = chainer.iterators.SerialIterator(dataset(), BATCH,
                                          order_sampler=ResumableShuffleOrderSampler(0))

    def rows(batch, device=None):  # this rank's rows of the global batch
        x, t = concat_examples(batch)
        lo, hi = comm.rank * BATCH // comm.size, (comm.rank + 1) * BATCH // comm.size
        return x[lo:hi], t[lo:hi]
    updater = chainer.training.StandardUpdater(it, opt, converter=rows, loss_func=model)
    trainer = chainer.training.Trainer(updater, (stop, "iteration"), out=out)
    trainer.extend(mnpar.extensions.checkpoint(comm, trigger=(3, "iteration")))
    return trainer


@pytest.fixture(scope="module")
def world():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


@pytest.fixture
def root(world):
    path = world.bcast_obj(tempfile.mkdtemp(prefix="mnpar-resume-") if world.rank == 0 else None)
    yield path
    world.allgather_obj(None)
    if world.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def sub(world, n):
    return world.split(int(world.rank >= n), world.rank)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage, resumed_stage", [(0, 0), (2, 2), (0, 3), (1, 2), (2, 1),
                                                  (3, 0), (3, 3)])
def test_resumed_run_continues_as_the_unbroken_one(world, root, stage, resumed_stage):
    unbroken = os.path.join(root, "unbroken")
    make_trainer(world, stage, unbroken).run()
    for n in sorted({1, world.size}):
        comm = sub(world, n)
        if world.rank < n:
            out = os.path.join(root, f"resumed{n}")
            trainer = make_trainer(comm, resumed_stage, out)
            start = mnpar.extensions.resume_checkpoint(
                comm, trainer, os.path.join(unbroken, "checkpoint_iter_3"))
            assert start == 3 and trainer.updater.iteration == 3
            trainer.run()
        comm.finalize()
        world.allgather_obj(None)
        if world.rank == 0:
            want = mnpar.checkpoint.consolidate(os.path.join(unbroken, "checkpoint_iter_6"),
                                                os.path.join(root, "a.npz"), "trainer")
            got = mnpar.checkpoint.consolidate(os.path.join(out, "checkpoint_iter_6"),
                                               os.path.join(root, "b.npz"), "trainer")
            assert sorted(want) == sorted(got)
            same = n == world.size and stage == resumed_stage
            for key in set(want) - {"_snapshot_elapsed_time"}:
                if same or want[key].dtype.kind != "f":  # counters, the data order
                    assert np.array_equal(want[key], got[key]), key
                else:
                    np.testing.assert_allclose(got[key], want[key], rtol=1e-11, atol=1e-13,
                                               err_msg=key)


@pytest.mark.mpi(min_size=1)
def test_consolidated_trainer_loads_in_one_process_with_chainers_load_npz(world, root):
    make_trainer(world, 2, root, stop=3).run()
    world.allgather_obj(None)
    if world.rank != 0:
        return
    npz = os.path.join(root, "trainer.npz")
    mnpar.checkpoint.consolidate(os.path.join(root, "checkpoint_iter_3"), npz, "trainer")
    model = Net(seed=9)
    opt = chainer.optimizers.Adam(alpha=0.01).setup(model)
    it = chainer.iterators.SerialIterator(dataset(), BATCH,
                                          order_sampler=ResumableShuffleOrderSampler(0))
    trainer = chainer.training.Trainer(
        chainer.training.StandardUpdater(it, opt, loss_func=model), (6, "iteration"),
        out=os.path.join(root, "one"))
    chainer.serializers.load_npz(npz, trainer)
    assert trainer.updater.iteration == 3
    with np.load(npz) as f:
        for name, p in model.namedparams():
            assert np.array_equal(p.array, f["updater/model:main" + name]), name
        assert np.array_equal(model.l1.W.update_rule.state["m"],
                              f["updater/optimizer:main/l1/W/m"])
    alone = Net(seed=9)
    mnpar.checkpoint.consolidate(os.path.join(root, "checkpoint_iter_3"),
                                 os.path.join(root, "model.npz"))
    chainer.serializers.load_npz(os.path.join(root, "model.npz"), alone)
    for (name, a), (_, b) in zip(sorted(alone.namedparams()), sorted(model.namedparams())):
        assert np.array_equal(a.array, b.array), name


def test_command_line_tool_lists_and_consolidates(tmp_path):
    comm = mnpar.create_communicator("naive", timeout=30)
    try:
        make_trainer(comm, 3, str(tmp_path), stop=3).run()
    finally:
        comm.finalize()
    path = str(tmp_path / "checkpoint_iter_3")
    model_npz = str(tmp_path / "model.npz")
    done = subprocess.run([sys.executable, "-m", "mnpar.checkpoint", "consolidate", path,
                           model_npz], check=True, capture_output=True, text=True, timeout=120)
    assert "wrote" in done.stdout
    alone = Net(seed=9)
    chainer.serializers.load_npz(model_npz, alone)
    with np.load(model_npz) as f:
        assert sorted(f.files) == sorted(n.lstrip("/") for n, _ in alone.namedparams())
    listed = subprocess.run([sys.executable, "-m", "mnpar.checkpoint", "list", path],
                            check=True, capture_output=True, text=True, timeout=120).stdout
    assert "1 rank(s), iteration 3" in listed
    assert "rank 0: Adam, stage 3 sharded over 1 data rank(s)" in listed
    assert "array model:main/l1/W float64 7x5: 1 piece(s) in 1 file(s)" in listed
    assert "value trainer/updater/iteration: every rank alike" in listed
    bad = subprocess.run([sys.executable, "-m", "mnpar.checkpoint", "list", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "has no index.json" in bad.stderr


def test_a_rank_killed_mid_write_leaves_the_previous_checkpoint(tmp_path):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable,
                           os.path.join(HERE, "scripts", "crash_checkpoint.py"), str(tmp_path)],
                          env=dict(os.environ, MNPAR_ABORT_ON_ERROR="1"), capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode != 0
    assert not (tmp_path / "checkpoint_iter_2").exists()
    left = [n for n in os.listdir(tmp_path) if n.startswith(".checkpoint_iter_2.tmp-")]
    assert left, os.listdir(tmp_path)
    comm = mnpar.create_communicator("naive", timeout=30)
    try:
        model = chainer.Sequential(chainer.links.Linear(3, 4), chainer.links.Linear(4, 2))
        opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), comm, stage=1)
        index = mnpar.checkpoint.load(str(tmp_path / "checkpoint_iter_1"), comm, opt.setup(model))
        assert index.ranks == 2
    finally:
        comm.finalize()
    trainer = type("T", (), {"out": str(tmp_path)})()
    assert mnpar.checkpoint.latest(str(tmp_path)).endswith("checkpoint_iter_1")
    mnpar.extensions.checkpoint(comm).initialize(trainer)  # a new run's first step
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
