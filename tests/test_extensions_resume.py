"""Resume: every rank finds and loads the newest iteration that all ranks wrote."""
import functools
import os

import chainer
import chainer.links as L
import helpers
import numpy as np
import pytest

import mnpar
from mnpar.extensions import _files, snapshot_filename
from mnpar.pipeline import build_stage

# Batches of 5 from 24 points: epochs end in the middle of a batch.
tiny_trainer = functools.partial(helpers.tiny_trainer, batch_size=5)


def params(trainer):
    model = trainer.updater.get_optimizer("main").target
    return {name: p.array.copy() for name, p in model.namedparams()}


def fake_snapshots(directory, rank, iterations):
    os.makedirs(directory, exist_ok=True)
    for i in iterations:
        np.savez(os.path.join(directory, snapshot_filename(i, rank)), x=np.zeros(1))


def test_resumed_training_equals_uninterrupted_training_bit_for_bit(tmp_path, comm):
    whole = tiny_trainer(tmp_path / "whole", stop=20)
    whole.extend(mnpar.extensions.snapshot(comm, n_retains=None, trigger=(3, "iteration")))
    whole.run()

    resumed = tiny_trainer(tmp_path / "resumed", stop=20, init_seed=1)  # other weights
    start = mnpar.extensions.resume(comm, resumed, str(tmp_path / "whole"), iteration=9)
    assert start == 9 and resumed.updater.iteration == 9
    resumed.run()
    expected, got = params(whole), params(resumed)
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name].tobytes() == expected[name].tobytes(), name


def test_resume_without_snapshots_loads_nothing(tmp_path, comm):
    trainer = tiny_trainer(tmp_path / "nothing-here", stop=2)
    before = params(trainer)
    assert mnpar.extensions.resume(comm, trainer) is None
    assert trainer.updater.iteration == 0
    for name, value in params(trainer).items():
        np.testing.assert_array_equal(value, before[name])


def test_resume_defaults_to_the_newest_in_trainer_out(tmp_path, comm):
    first = tiny_trainer(tmp_path, stop=7)
    first.extend(mnpar.extensions.snapshot(comm, trigger=(2, "iteration")))
    first.run()
    second = tiny_trainer(tmp_path, stop=7)
    assert mnpar.extensions.resume(comm, second) == 6
    assert second.updater.iteration == 6


def test_a_snapshot_whose_name_lies_is_an_error(tmp_path, comm):
    trainer = tiny_trainer(tmp_path, stop=2)
    trainer.extend(mnpar.extensions.snapshot(comm, trigger=(2, "iteration")))
    trainer.run()
    rank = comm.rank
    os.rename(tmp_path / snapshot_filename(2, rank), tmp_path / snapshot_filename(5, rank))
    with pytest.raises(RuntimeError, match="holds a trainer at iteration 2, not 5"):
        mnpar.extensions.resume(comm, tiny_trainer(tmp_path, stop=2))


@pytest.mark.mpi(min_size=1)
def test_ranks_with_different_snapshots_agree_on_the_newest_common(tmp_path, comm):
    # Every rank has 10 and 20; 30 only on even ranks; 40 on rank 0 only, being
    # written (a temporary file) elsewhere; 50 on the last rank, cut short.
    rank, size = comm.rank, comm.size
    its = [10, 20] + ([30] if rank % 2 == 0 else []) + ([40] if rank == 0 else [])
    fake_snapshots(tmp_path, rank, its)
    if rank != 0:
        (tmp_path / f".{snapshot_filename(40, rank)}.abc.tmp").write_bytes(b"PK")
    if rank == size - 1:
        (tmp_path / snapshot_filename(50, rank)).write_bytes(b"PK\x03\x04 cut")
    expected = 40 if size == 1 else 20
    found = mnpar.extensions.find_common_snapshot(comm, str(tmp_path))
    assert found == expected
    assert comm.allgather_obj(found) == [expected] * size


@pytest.mark.mpi(min_size=2)
def test_no_common_snapshot_is_none_on_every_rank(tmp_path, comm):
    fake_snapshots(tmp_path, comm.rank, [] if comm.rank == 1 else [10, 20])
    assert mnpar.extensions.find_common_snapshot(comm, str(tmp_path)) is None


@pytest.mark.mpi(min_size=2)
def test_an_iteration_missing_on_some_rank_is_an_error_on_every_rank(tmp_path, comm):
    fake_snapshots(tmp_path, comm.rank, [10] if comm.rank == 1 else [10, 20])
    trainer = tiny_trainer(tmp_path, stop=1)
    with pytest.raises(ValueError, match=r"iteration=20: rank\(s\) \[1\] have no complete "
                                         r"'snapshot_iter_20.rank1.npz'"):
        mnpar.extensions.resume(comm, trainer, iteration=20)


@pytest.mark.mpi(min_size=2)
def test_every_rank_loads_the_same_iteration_after_one_died_mid_write(tmp_path, comm):
    trainer = tiny_trainer(tmp_path, stop=9, init_seed=comm.rank)
    trainer.extend(mnpar.extensions.snapshot(comm, trigger=(3, "iteration")))
    trainer.run()
    if comm.rank == 1:  # died writing iteration 9: only its temporary file is left
        final = tmp_path / snapshot_filename(9, 1)
        os.rename(final, tmp_path / f".{final.name}.x.tmp")
    again = tiny_trainer(tmp_path, stop=9, init_seed=comm.rank)
    assert mnpar.extensions.resume(comm, again) == 6
    assert again.updater.iteration == 6


def test_a_snapshot_file_names_the_iteration_and_prefix(tmp_path, comm):
    first = tiny_trainer(tmp_path, stop=6)
    first.extend(mnpar.extensions.snapshot(comm, prefix="run", trigger=(2, "iteration")))
    first.run()
    other_rank = (comm.rank + 1) % comm.size  # any rank's file names the same snapshot
    path = str(tmp_path / snapshot_filename(4, other_rank, prefix="run"))
    again = tiny_trainer(tmp_path, stop=6)
    assert mnpar.extensions.resume(comm, again, path) == 4
    assert again.updater.iteration == 4


def test_a_path_that_is_no_snapshot_or_contradicts_the_iteration_is_an_error(tmp_path, comm):
    trainer = tiny_trainer(tmp_path, stop=1)
    with pytest.raises(ValueError, match=r"path='.*model.npz' is neither a directory nor a "
                                         r"snapshot file name like 'snapshot_iter_120.rank0"):
        mnpar.extensions.resume(comm, trainer, str(tmp_path / "model.npz"))
    with pytest.raises(ValueError, match="iteration=3 contradicts path="):
        mnpar.extensions.resume(comm, trainer, str(tmp_path / snapshot_filename(4, 0)),
                                iteration=3)


def snapshot_at(comm, out, iteration=3):
    """Trains ``tiny_trainer`` to ``iteration`` on ``comm`` and snapshots it there."""
    trainer = tiny_trainer(out, stop=iteration)
    trainer.extend(mnpar.extensions.snapshot(comm, trigger=(iteration, "iteration")))
    trainer.run()


@pytest.mark.mpi(min_size=2)
def test_a_snapshot_of_more_ranks_is_refused_on_every_rank(tmp_path, comm):
    # Regression (issue 40): written by n ranks, loaded by 1, rank 0 loaded its file into
    # arrays of another size (chainer's "could not broadcast") and rank 1's file was
    # ignored. Each rank now resumes alone, and each refuses what n ranks wrote.
    snapshot_at(comm, tmp_path)
    alone = comm.split(comm.rank, 0)
    try:
        with pytest.raises(ValueError, match=(
                rf"resume: snapshot snapshot_iter_3 in '{tmp_path}' was written by (at least "
                rf"{comm.rank + 1}|{comm.size}) ranks.* and is loaded by 1 rank[:;] .*loads "
                "only under the rank count and the split that wrote it")):
            mnpar.extensions.resume(alone, tiny_trainer(tmp_path, stop=6))
    finally:
        alone.finalize()


@pytest.mark.mpi(min_size=2)
def test_a_snapshot_of_fewer_ranks_is_refused_on_every_rank_rather_than_ignored(tmp_path,
                                                                                  comm):
    # Each rank wrote alone (rank 0's file only, in each directory): no iteration is
    # complete on every rank of the job, which once meant a silent fresh start.
    alone = comm.split(comm.rank, 0)
    try:
        snapshot_at(alone, tmp_path)
    finally:
        alone.finalize()
    with pytest.raises(ValueError, match=(
            rf"resume: snapshot snapshot_iter_3 in '{tmp_path}' was written by 1 ranks and "
            rf"is loaded by {comm.size} ranks: snapshot_iter_3.rank0.npz was written by rank 0 "
            rf"of 1 rank, holding no split model, and rank 0 of {comm.size} ranks, holding no "
            "split model loads it")):
        mnpar.extensions.resume(comm, tiny_trainer(tmp_path, stop=6))


def staged_trainer(comm, out, chunks):
    """A trainer of the same 4-layer model cut into one part per rank, or two."""
    np.random.seed(0)
    model = chainer.Sequential(*[L.Linear(3, 3) for _ in range(4)])
    balance = [1] * (comm.size * chunks)
    balance[-1] += 4 - sum(balance)
    stage = build_stage(model, balance, comm, chunks=chunks)
    target = L.Classifier(stage) if comm.rank == 0 else stage
    optimizer = chainer.optimizers.SGD().setup(target)
    it = chainer.iterators.SerialIterator([np.zeros(3, np.float32)], 1)
    trainer = chainer.training.Trainer(
        chainer.training.updaters.StandardUpdater(it, optimizer), lambda _: True, out=out)
    trainer.run()  # no update: what a snapshot writes is there
    return trainer


@pytest.mark.mpi(min_size=1)
def test_a_snapshot_of_another_split_is_refused_on_every_rank(tmp_path, comm):
    if comm.size > 2:  # 4 layers: two parts a rank fit up to 2 ranks
        return
    written = staged_trainer(comm, str(tmp_path), chunks=2)
    mnpar.extensions.snapshot(comm)(written)
    with pytest.raises(ValueError, match=(
            rf"resume: snapshot snapshot_iter_0 in '{tmp_path}' was written under another "
            rf"split: snapshot_iter_0.rank\d.npz was written by rank \d of {comm.size} ranks?, "
            r"holding main:/(predictor)?: build_stage\(balance=\[1, .*\], chunks=2, .*, and "
            r"rank \d of \d ranks?, holding .*build_stage\(balance=\[.*\], chunks=1, .* loads "
            r"it")):
        mnpar.extensions.resume(comm, staged_trainer(comm, str(tmp_path), chunks=1))


def test_a_snapshot_says_what_wrote_it_and_still_loads_in_chainer(tmp_path, comm):
    snapshot_at(comm, tmp_path)
    file = os.path.join(tmp_path, snapshot_filename(3, comm.rank))
    assert _files.written_by(file) == {"ranks": comm.size, "rank": comm.rank, "splits": {}}
    trainer = tiny_trainer(tmp_path, stop=6)
    chainer.serializers.load_npz(file, trainer)  # the record is one more entry, never read
    assert trainer.updater.iteration == 3
