"""The checkpointer: atomic per-rank files, resume from the newest iteration all ranks hold."""
import os

import chainer
import numpy as np
import pytest
from helpers import tiny_trainer

import mnpar
from mnpar.extensions import create_multi_node_checkpointer, snapshot_filename


def params(trainer):
    model = trainer.updater.get_optimizer("main").target
    return {name: p.array.copy() for name, p in model.namedparams()}


class Crash(Exception):
    pass


def crash_at(iteration):
    @chainer.training.make_extension(trigger=(iteration, "iteration"), priority=-1000)
    def crash(trainer):
        raise Crash(f"crashed at {trainer.updater.iteration}")
    return crash


def run_until_crash(comm, out, crash, every=3, stop=12, **kwargs):
    trainer = tiny_trainer(out, stop=stop)
    cp = create_multi_node_checkpointer("run", comm, **kwargs)
    trainer.extend(cp, trigger=(every, "iteration"))
    trainer.extend(crash_at(crash))
    with pytest.raises(Crash):
        trainer.run()
    return cp


def mine(directory, rank):
    return mnpar.extensions.complete_iterations(str(directory), rank, "run")


@pytest.mark.mpi(min_size=1)
def test_resumed_training_equals_uninterrupted_training_bit_for_bit(tmp_path, mcomm):
    whole = tiny_trainer(tmp_path / "whole", stop=12)
    whole.run()
    run_until_crash(mcomm, tmp_path / "cp", crash=7)
    assert mine(tmp_path / "cp", mcomm.rank) == [3, 6]  # kept: the run failed

    again = tiny_trainer(tmp_path / "cp", stop=12, init_seed=1)
    cp = create_multi_node_checkpointer("run", mcomm)
    again.extend(cp, trigger=(3, "iteration"))
    assert cp.maybe_load(again) == 6 and again.updater.iteration == 6
    again.run()
    for name, value in params(whole).items():
        assert params(again)[name].tobytes() == value.tobytes(), name
    assert mine(tmp_path / "cp", mcomm.rank) == []  # finished: finalize removed them
    assert cp.get_stats().startswith("Snapshot duration stats (sec): avg=")


@pytest.mark.mpi(min_size=2)
def test_a_rank_missing_its_newest_file_makes_every_rank_resume_where_resume_would(
        tmp_path, mcomm):
    run_until_crash(mcomm, tmp_path, crash=10)
    if mcomm.rank == 1:  # died while writing 9: only its temporary file is left
        final = tmp_path / snapshot_filename(9, 1, "run")
        os.rename(final, tmp_path / f".{final.name}.x.tmp")
    expected = mnpar.extensions.find_common_snapshot(mcomm, str(tmp_path), "run")
    assert expected == 6

    again = tiny_trainer(tmp_path, stop=12)
    cp = create_multi_node_checkpointer("run", mcomm)
    assert cp.maybe_load(again, optimizer=again.updater.get_optimizer("main")) == 6
    assert again.updater.iteration == 6
    assert mcomm.allgather_obj(again.updater.iteration) == [6] * mcomm.size
    by_resume = tiny_trainer(tmp_path, stop=12)
    assert mnpar.extensions.resume(mcomm, by_resume, prefix="run") == 6


@pytest.mark.mpi(min_size=1)
def test_nothing_to_load_leaves_the_trainer_at_iteration_zero(tmp_path, mcomm):
    trainer = tiny_trainer(tmp_path, stop=2)
    cp = create_multi_node_checkpointer("run", mcomm, path=str(tmp_path / "cps"))
    assert os.path.isdir(tmp_path / "cps")
    assert cp.maybe_load(trainer) is None and trainer.updater.iteration == 0
    assert cp.get_stats() == "No stats available"


@pytest.mark.mpi(min_size=1)
def test_old_checkpoints_are_collected_keeping_cp_interval(tmp_path, mcomm):
    # With cp_interval=2 and gc_interval=3, the 6th save (2 + 3 < 6) collects.
    cp = create_multi_node_checkpointer("run", mcomm, cp_interval=2, gc_interval=3,
                                        path=str(tmp_path))
    model = chainer.links.Linear(2, 2)
    for i in range(1, 6):
        cp.save(model, i)
    assert mine(tmp_path, mcomm.rank) == [1, 2, 3, 4, 5]
    cp.save(model, 6)
    assert mine(tmp_path, mcomm.rank) == [5, 6]
    assert cp.files == [snapshot_filename(i, mcomm.rank, "run") for i in (5, 6)]
    cp.finalize()
    assert mine(tmp_path, mcomm.rank) == []


@pytest.mark.mpi(min_size=1)
def test_used_without_a_trainer(tmp_path, mcomm):
    model = chainer.links.Linear(2, 2)
    cp = create_multi_node_checkpointer("run", mcomm)
    assert cp.maybe_load(model, path=str(tmp_path)) is None
    cp.save(model, 1)
    expected = model.W.array.copy()
    model.W.array[...] = 0
    again = create_multi_node_checkpointer("run", mcomm, path=str(tmp_path))
    assert again.maybe_load(model) == 1
    np.testing.assert_array_equal(model.W.array, expected)


def test_saving_without_a_path_is_an_error(comm):
    cp = create_multi_node_checkpointer("run", comm)
    with pytest.raises(ValueError, match="the checkpointer has no path"):
        cp.save(chainer.links.Linear(2, 2), 1)


def test_its_name_in_the_trainer_is_the_runs_as_in_chainermn(tmp_path, comm):
    trainer = tiny_trainer(tmp_path, stop=1)
    trainer.extend(create_multi_node_checkpointer("run7", comm))
    assert "run7" in trainer._extensions


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(cp_interval=0), ValueError, "cp_interval=0 must be at least 1"),
    (dict(gc_interval=-1), ValueError, "gc_interval=-1 must be at least 1"),
    (dict(cp_interval=2.5), TypeError, "cp_interval=2.5 must be an int"),
    (dict(name="a/b"), ValueError, "prefix='a/b' must be a plain file name part"),
    (dict(name=None), TypeError, "name=None must be a string"),
])
def test_bad_arguments_are_clear_errors(comm, kwargs, error, match):
    kwargs = dict(dict(name="run"), **kwargs)
    with pytest.raises(error, match=match):
        create_multi_node_checkpointer(comm=comm, **kwargs)


@pytest.mark.mpi(min_size=2)
def test_checkpoints_of_another_rank_count_are_refused_on_every_rank(tmp_path, mcomm):
    trainer = tiny_trainer(tmp_path, stop=3)
    trainer.run()
    create_multi_node_checkpointer("run", mcomm, path=str(tmp_path)).save(trainer, 3)
    alone = mcomm.split(mcomm.rank, 0)  # each rank resumes alone
    try:
        with pytest.raises(ValueError, match=(
                rf"maybe_load: snapshot run_iter_3 in '{tmp_path}' was written by (at least "
                rf"{mcomm.rank + 1}|{mcomm.size}) ranks.* and is loaded by 1 rank")):
            create_multi_node_checkpointer("run", alone, path=str(tmp_path)).maybe_load(
                tiny_trainer(tmp_path, stop=6))
    finally:
        alone.finalize()
