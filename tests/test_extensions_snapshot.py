"""Per-rank snapshots: file names, atomic writes, retention, leftovers ignored."""
import os

import chainer
import numpy as np
import pytest
from helpers import tiny_trainer

import mnpar
from mnpar.extensions import (
    _snapshot,
    complete_iterations,
    parse_snapshot_filename,
    snapshot_filename,
)


class FakeComm:
    """Just a rank: writing a snapshot needs no communication."""

    def __init__(self, rank):
        self.rank = rank


def names(directory):
    return sorted(os.listdir(directory))


def test_file_names_round_trip():
    assert snapshot_filename(120, 1) == "snapshot_iter_120.rank1.npz"
    assert parse_snapshot_filename("/a/b/snapshot_iter_120.rank1.npz") == ("snapshot", 120, 1)
    assert parse_snapshot_filename("my_run_iter_7.rank12.npz") == ("my_run", 7, 12)
    for other in (".snapshot_iter_120.rank1.npz.x1.tmp", "snapshot_iter_120.npz",
                  "snapshot_iter_x.rank1.npz", "snapshot_iter_120.rank1.npz.bak"):
        assert parse_snapshot_filename(other) is None, other


def test_writes_every_trigger_with_the_rank_in_the_name_and_keeps_the_newest(tmp_path):
    trainer = tiny_trainer(tmp_path, stop=6)
    trainer.extend(mnpar.extensions.snapshot(FakeComm(3), trigger=(1, "iteration")))
    trainer.run()
    assert names(tmp_path) == [f"snapshot_iter_{i}.rank3.npz" for i in (4, 5, 6)]
    assert complete_iterations(str(tmp_path), 3) == [4, 5, 6]
    assert complete_iterations(str(tmp_path), 0) == []
    with np.load(tmp_path / "snapshot_iter_6.rank3.npz") as saved:
        assert int(saved["updater/iteration"]) == 6
        np.testing.assert_array_equal(saved["updater/model:main/predictor/W"],
                                      trainer.updater.get_optimizer("main").target
                                      .predictor.W.array)


def test_n_retains_none_keeps_all_and_prefix_and_directory_are_used(tmp_path):
    trainer = tiny_trainer(tmp_path / "out", stop=4)
    trainer.extend(mnpar.extensions.snapshot(FakeComm(0), n_retains=None, prefix="run",
                                             directory=str(tmp_path / "snaps"),
                                             trigger=(2, "iteration")))
    trainer.run()
    assert names(tmp_path / "snaps") == ["run_iter_2.rank0.npz", "run_iter_4.rank0.npz"]
    assert complete_iterations(str(tmp_path / "snaps"), 0, prefix="snapshot") == []


def test_a_write_that_fails_midway_leaves_the_earlier_snapshots_and_no_file(tmp_path,
                                                                           monkeypatch):
    trainer = tiny_trainer(tmp_path, stop=3)
    trainer.extend(mnpar.extensions.snapshot(FakeComm(1), trigger=(1, "iteration")))
    real_save = _snapshot.files.save_npz

    def dying_save(path, target, layout):
        if target.updater.iteration == 3:
            with open(path, "wb") as f:
                f.write(b"PK\x03\x04 half a snapshot")
            raise OSError("disk full")
        real_save(path, target, layout)

    monkeypatch.setattr(_snapshot.files, "save_npz", dying_save)
    with pytest.raises(OSError, match="disk full"):
        trainer.run()
    assert names(tmp_path) == ["snapshot_iter_1.rank1.npz", "snapshot_iter_2.rank1.npz"]


def test_temporary_and_truncated_files_never_count(tmp_path):
    trainer = tiny_trainer(tmp_path, stop=2)
    trainer.extend(mnpar.extensions.snapshot(FakeComm(0), trigger=(1, "iteration")))
    trainer.run()
    whole = (tmp_path / "snapshot_iter_2.rank0.npz").read_bytes()
    # A rank killed while writing leaves its temporary file behind ...
    (tmp_path / ".snapshot_iter_3.rank0.npz.k3j9_x.tmp").write_bytes(whole[:100])
    # ... and a copy cut short under a final name is no snapshot either.
    (tmp_path / "snapshot_iter_4.rank0.npz").write_bytes(whole[:-10])
    assert complete_iterations(str(tmp_path), 0) == [1, 2]


def test_a_new_run_removes_its_own_leftover_temporary_files_only(tmp_path):
    mine = tmp_path / ".snapshot_iter_3.rank0.npz.abc.tmp"
    other_rank = tmp_path / ".snapshot_iter_3.rank1.npz.abc.tmp"
    other_prefix = tmp_path / ".model_iter_3.rank0.npz.abc.tmp"
    for path in (mine, other_rank, other_prefix):
        path.write_bytes(b"partial")
    trainer = tiny_trainer(tmp_path, stop=1)
    trainer.extend(mnpar.extensions.snapshot(FakeComm(0), trigger=(1, "iteration")))
    trainer.run()
    assert not mine.exists()
    assert other_rank.exists() and other_prefix.exists()


def test_snapshots_beyond_the_current_iteration_are_from_an_abandoned_run(tmp_path):
    np.savez(tmp_path / "snapshot_iter_9.rank0.npz", x=np.zeros(1))
    np.savez(tmp_path / "snapshot_iter_9.rank1.npz", x=np.zeros(1))
    trainer = tiny_trainer(tmp_path, stop=2)
    trainer.extend(mnpar.extensions.snapshot(FakeComm(0), trigger=(1, "iteration")))
    trainer.run()
    assert names(tmp_path) == ["snapshot_iter_1.rank0.npz", "snapshot_iter_2.rank0.npz",
                               "snapshot_iter_9.rank1.npz"]


@pytest.mark.parametrize("n_retains", [0, 1, -1, 2.5, True])
def test_rejects_n_retains_below_two(n_retains):
    with pytest.raises(ValueError, match=rf"n_retains={n_retains!r} must be an int >= 2"):
        mnpar.extensions.snapshot(FakeComm(0), n_retains=n_retains)


@pytest.mark.parametrize("prefix", ["", "a/b", ".hidden"])
def test_rejects_a_prefix_that_is_not_a_plain_name(prefix):
    with pytest.raises(ValueError, match="prefix="):
        mnpar.extensions.snapshot(FakeComm(0), prefix=prefix)


def test_rejects_something_without_a_rank():
    with pytest.raises(TypeError, match="comm must be a communicator with an int rank, not str"):
        mnpar.extensions.snapshot("world")


def test_default_trigger_and_priority():
    ext = mnpar.extensions.snapshot(FakeComm(0))
    assert ext.trigger == (1, "epoch")
    assert ext.priority < chainer.training.PRIORITY_READER


def test_a_snapshot_gets_the_usual_file_mode(tmp_path):
    # Regression: files made by mkstemp are 0600, unreadable to a colleague's resume.
    umask = os.umask(0o022)
    try:
        trainer = tiny_trainer(tmp_path, stop=1)
        trainer.extend(mnpar.extensions.snapshot(FakeComm(0), trigger=(1, "iteration")))
        trainer.run()
    finally:
        os.umask(umask)
    assert (tmp_path / "snapshot_iter_1.rank0.npz").stat().st_mode & 0o777 == 0o644
