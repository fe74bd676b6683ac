"""multi_node_snapshot: replica sets as ChainerMN reads them, one writer per set, autoload."""
import os
import warnings

import numpy as np
import pytest
from chainer.training import extensions as E
from helpers import chainermn_and_comm, tiny_trainer

import mnpar
from mnpar.extensions._multi_node_snapshot import parse_replica_sets


def params(trainer):
    model = trainer.updater.get_optimizer("main").target
    return {name: p.array.copy() for name, p in model.namedparams()}


@pytest.mark.chainermn
@pytest.mark.parametrize("replica_sets, size, expected", [
    ([0], 4, [{0}, {1, 2, 3}]),
    ([0, 1], 4, [{0}, {1}, {2, 3}]),
    ([[0, 1], [2, 3]], 4, [{0, 1}, {2, 3}]),
    ([], 4, [{0, 1, 2, 3}]),
    ([range(0, 8, 2)], 8, [set(range(0, 8, 2)), set(range(1, 8, 2))]),
    (range(3), 3, [{0}, {1}, {2}]),
])
def test_replica_sets_are_read_as_chainermn_reads_them(replica_sets, size, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from chainermn.extensions._multi_node_snapshot import _parse_replica_sets

    assert _parse_replica_sets(replica_sets, size) == expected
    assert parse_replica_sets(replica_sets, size) == expected


def test_a_replica_set_may_be_any_iterable_of_ranks():
    assert parse_replica_sets([(r for r in (2, 0)), {1}], 4) == [{0, 2}, {1}, {3}]


@pytest.mark.parametrize("replica_sets, error, match", [
    (None, TypeError, "replica_sets must be a list .* not NoneType"),
    ("01", TypeError, "not str"),
    ([4], ValueError, r"replica_sets\[0\] names rank 4, out of range for a communicator of "
                      "size 4"),
    ([[0, -1]], ValueError, "names rank -1"),
    ([[0, 1], [1, 2]], ValueError, r"rank 1 is in replica_sets\[0\] and replica_sets\[1\]"),
    ([0, [0]], ValueError, "rank 0 is in"),
    ([[]], ValueError, r"replica_sets\[0\]=\[\] is empty"),
    ([1.0], TypeError, r"replica_sets\[0\]=1.0 must be a rank or an iterable of ranks"),
    ([[0, True]], TypeError, r"replica_sets\[0\] holds True \(bool\)"),
])
def test_bad_replica_sets_are_clear_errors(replica_sets, error, match):
    with pytest.raises(error, match=match):
        parse_replica_sets(replica_sets, 4)


def shared_directory(comm, tmp_path):
    """Rank 0's tmp_path, where every rank writes, as with one trainer.out for all."""
    return comm.bcast_obj(str(tmp_path))


def trainer_with(comm, out, stop, replica_sets, autoload=False, seed=None):
    trainer = tiny_trainer(out, stop=stop, init_seed=comm.rank if seed is None else seed)
    snap = E.snapshot(autoload=autoload)
    trainer.extend(mnpar.extensions.multi_node_snapshot(comm, snap, replica_sets),
                   trigger=(2, "iteration"))
    return trainer


@pytest.mark.mpi(min_size=1)
def test_only_the_lowest_rank_of_each_set_writes_with_its_rank_appended(tmp_path, mcomm):
    out = shared_directory(mcomm, tmp_path)
    trainer_with(mcomm, out, 4, [0]).run()
    mcomm.allgather_obj(None)  # every rank has written
    written = sorted(n for n in os.listdir(out) if n.startswith("snapshot_iter_"))
    masters = [0] if mcomm.size == 1 else [0, 1]
    assert written == sorted(f"snapshot_iter_{i}.{m}" for i in (2, 4) for m in masters)


@pytest.mark.chainermn
@pytest.mark.mpi(min_size=2)
def test_file_names_are_those_chainermn_writes(tmp_path, mcomm):
    chainermn, theirs_comm = chainermn_and_comm()
    ours_dir, theirs_dir = (shared_directory(mcomm, tmp_path / d) for d in ("ours", "theirs"))
    trainer_with(mcomm, ours_dir, 4, [0]).run()
    theirs = tiny_trainer(theirs_dir, stop=4, init_seed=0)
    theirs.extend(chainermn.extensions.multi_node_snapshot(theirs_comm, E.snapshot(), [0]),
                  trigger=(2, "iteration"))
    theirs.run()
    mcomm.allgather_obj(None)
    assert sorted(os.listdir(ours_dir)) == sorted(os.listdir(theirs_dir))


@pytest.mark.mpi(min_size=1)
def test_autoload_gives_every_rank_of_a_set_its_masters_state(tmp_path, mcomm):
    out = shared_directory(mcomm, tmp_path)
    first = trainer_with(mcomm, out, 6, [0])
    first.run()
    saved = mcomm.allgather_obj(params(first))
    mcomm.allgather_obj(None)

    again = trainer_with(mcomm, out, 6, [0], autoload=True, seed=100 + mcomm.rank)
    again.run()  # initialize loads iteration 6, where the trainer stops at once
    assert again.updater.iteration == 6
    master = 0 if mcomm.rank == 0 else 1
    for name, value in params(again).items():
        np.testing.assert_array_equal(value, saved[master][name], err_msg=name)


@pytest.mark.mpi(min_size=2)
def test_sets_that_resumed_from_different_iterations_are_an_error_on_every_rank(
        tmp_path, mcomm):
    out = shared_directory(mcomm, tmp_path)
    trainer_with(mcomm, out, 6, [0]).run()
    mcomm.allgather_obj(None)
    if mcomm.rank == 1:  # rank 1 died before its last snapshot
        os.remove(os.path.join(out, "snapshot_iter_6.1"))
    mcomm.allgather_obj(None)
    again = trainer_with(mcomm, out, 8, [0], autoload=True)
    with pytest.raises(RuntimeError, match=r"resumed from different iterations \(rank 0: "
                                           r"iteration 6, rank 1: iteration 4\)"):
        again.run()


@pytest.mark.mpi(min_size=1)
def test_the_wrapper_keeps_the_snapshots_trigger_and_priority(mcomm):
    ext = mnpar.extensions.multi_node_snapshot(mcomm, E.snapshot(), [])
    assert ext.trigger == (1, "epoch") and ext.priority == -100
    assert ext.is_master == (mcomm.rank == 0)
    named = E.snapshot(filename=lambda t: "model")
    mnpar.extensions.multi_node_snapshot(mcomm, named, [0])
    assert named.filename(None) == f"model.{mcomm.rank}"


def test_mnpar_snapshot_needs_no_wrapper(comm):
    with pytest.raises(TypeError, match="mnpar.extensions.snapshot already writes one file "
                                        "per rank"):
        mnpar.extensions.multi_node_snapshot(comm, mnpar.extensions.snapshot(comm), [])


@pytest.mark.mpi(min_size=2)
def test_a_snapshot_of_another_rank_count_is_refused_on_every_rank(tmp_path, mcomm):
    # Each rank restarts alone, the master of its own set, and finds rank 0's newest
    # file: n ranks wrote it, one loads it. Refused before anything is loaded.
    out = shared_directory(mcomm, tmp_path)
    trainer_with(mcomm, out, 4, [0]).run()
    mcomm.allgather_obj(None)
    alone = mcomm.split(mcomm.rank, 0)
    try:
        again = trainer_with(alone, out, 6, [0], autoload=True)
        with pytest.raises(ValueError, match=(
                rf"multi_node_snapshot: snapshot_iter_4.0 in '{out}' was written by rank 0 "
                rf"of {mcomm.size} ranks \(replica set \[0\]\), holding no split model, and "
                r"rank 0 of 1 rank \(replica set \[0\]\), holding no split model loads it; a "
                "snapshot loads only under the rank count, replica sets and split")):
            again.run()
        assert again.updater.iteration == 0
    finally:
        alone.finalize()
