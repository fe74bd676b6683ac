"""Bad checkpoints are refused on every rank, naming the file and the array, and
nothing is written over: another model's checkpoint, a missing, truncated or
damaged shard, a model split another way without names, a value the saving
ranks held differently at another rank count, an existing checkpoint; and a
rank failing between two shards' writes leaves the previous checkpoint as it was.
"""
import os
import shutil
import tempfile

import chainer
import chainer.links as L
import numpy as np
import pytest

import mnpar
from mnpar.checkpoint import CheckpointError, _write

pytestmark = pytest.mark.mpi(min_size=1)


@pytest.fixture(scope="module")
def comm():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


@pytest.fixture
def root(comm):
    path = comm.bcast_obj(tempfile.mkdtemp(prefix="mnpar-bad-") if comm.rank == 0 else None)
    yield path
    comm.allgather_obj(None)
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


class Two(chainer.Chain):
    def __init__(self, seed=0, width=4, names=("l1", "l2")):
        super().__init__()
        np.random.seed(seed)
        with self.init_scope():
            setattr(self, names[0], L.Linear(3, width))
            setattr(self, names[1], L.Linear(width, 2))


def saved(comm, root, model=None, stage=0):
    """A plain (or sharded) data-parallel checkpoint of ``model`` after one update."""
    model = Two() if model is None else model
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), comm, stage=stage)
    model.cleargrads()  # chainer's fresh gradients are NaN: zeros take part instead
    opt.setup(model).update()
    path = os.path.join(root, "ckpt")
    mnpar.checkpoint.save(path, comm, opt)
    return path


def loader(comm, model, stage=0):
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), comm, stage=stage)
    return opt.setup(model)


def params(model):
    return {n: p.array.copy() for n, p in model.namedparams()}


def state(opt):
    """Every array this rank holds (parameters or their shards, optimizer state)."""
    return {p.name: p.array.copy() for p in mnpar.checkpoint.holdings(opt, split=False).parts}


def refused(comm, path, model, match, stage=0, **kwargs):
    """Loading ``path`` into ``model`` is refused with ``match`` and changes nothing."""
    opt = loader(comm, model, stage)
    model.cleargrads()
    opt.update()
    before = state(opt)
    with pytest.raises(CheckpointError, match=match):
        mnpar.checkpoint.load(path, comm, opt, **kwargs)
    after = state(opt)
    assert before.keys() == after.keys()
    assert all(np.array_equal(before[n], after[n]) for n in before)


def test_another_models_checkpoint(comm, root):
    path = saved(comm, root)
    refused(comm, path, Two(seed=1, width=5),
            r"array 'model:main/l1/W' is float32 \(4, 3\) in the checkpoint, float32 \(5, 3\) "
            "here: a checkpoint of another model")


def test_names_the_checkpoint_does_not_hold(comm, root):
    path = saved(comm, root)
    refused(comm, path, Two(seed=1, names=("enc", "dec")),
            r"the checkpoint has no array 'model:main/dec/W' \(it has \['model:main/l1/W', "
            r"'model:main/l2/W'\]\)")


def test_arrays_no_rank_claims(comm, root):
    path = saved(comm, root)
    one = chainer.Chain()
    with one.init_scope():
        one.l1 = L.Linear(3, 4)
    refused(comm, path, one, "the checkpoint's array 'model:main/l2/W' .* is part of no rank's "
                             "model here")


def _last_file(path):
    files = sorted(f for f in os.listdir(path) if f.startswith("shard-"))
    return os.path.join(path, files[-1])


@pytest.mark.parametrize("stage", [0, 3])
def test_missing_shard(comm, root, stage):
    path = saved(comm, root, stage=stage)
    if comm.rank == 0:
        os.remove(_last_file(path))
    comm.allgather_obj(None)
    refused(comm, path, Two(seed=1), r"shard-\d+-of-\d+\.bin', which holds part of "
                                     r"'model:main/.*', is missing", stage=stage)


def test_truncated_shard(comm, root):
    path = saved(comm, root)
    if comm.rank == 0:
        with open(_last_file(path), "r+b") as f:
            f.truncate(10)
    comm.allgather_obj(None)
    refused(comm, path, Two(seed=1), r"\.bin', which holds part of '.*', is truncated: 10 bytes")


def test_damaged_shard(comm, root):
    path = saved(comm, root)
    if comm.rank == 0:
        with open(_last_file(path), "r+b") as f:
            first = f.read(1)
            f.seek(0)
            f.write(bytes([first[0] ^ 0xFF]))
    comm.allgather_obj(None)
    refused(comm, path, Two(seed=1), r"\.bin' is damaged: the bytes of 'model:main/l1/\w' at "
                                     "offset 0 do not match their checksum")


def test_not_a_checkpoint(comm, root):
    refused(comm, root, Two(seed=1), r"is not a checkpoint: it has no index\.json")


def test_an_existing_checkpoint_is_never_written_over(comm, root):
    path = saved(comm, root)
    before = sorted(os.listdir(path))
    with pytest.raises(CheckpointError, match="exists already; a checkpoint is never written "
                                              "over"):
        saved(comm, root)
    assert sorted(os.listdir(path)) == before


class Counted(Two):
    """A model with a persistent value that differs from rank to rank."""

    def __init__(self, value, seed=0):
        super().__init__(seed)
        self.add_persistent("seen", np.array([value], np.int64))


@pytest.mark.mpi(min_size=2)
def test_values_held_differently_load_only_at_the_same_rank_count(comm, root):
    path = saved(comm, root, model=Counted(comm.rank))
    own = comm.split(comm.rank, 0)
    try:
        refused(own, path, Counted(-1, seed=1),
                r"value 'model:main/seen' was held differently by the \d ranks that wrote it "
                r".* cannot be given to 1 ranks: it is rank-local state")
        model = Counted(-1, seed=1)  # the rest loads without it
        mnpar.checkpoint.load(path, own, loader(own, model), exclude=["model:main/seen"])
        assert model.seen[0] == -1
    finally:
        own.finalize()
    model = Counted(-1, seed=1)  # at the same rank count, each rank its own
    mnpar.checkpoint.load(path, comm, loader(comm, model))
    assert model.seen[0] == comm.rank


def test_a_rank_failing_between_two_shards_writes_leaves_the_last_checkpoint(comm, root,
                                                                             monkeypatch):
    path = saved(comm, root)  # Two(seed=0) after an update by zero gradients: unchanged
    first = params(Two())
    write = _write.write_rank_file

    def fail_after_writing(directory, rank, size, h):
        report = write(directory, rank, size, h)
        if rank == size - 1:
            raise OSError(28, "No space left on device")
        return report
    monkeypatch.setattr(_write, "write_rank_file", fail_after_writing)
    model = Two(seed=3)
    opt = loader(comm, model)
    model.cleargrads()
    opt.update()
    later = os.path.join(root, "later")
    with pytest.raises(CheckpointError, match=rf"rank {comm.size - 1}: .*No space left on "
                                              "device"):
        mnpar.checkpoint.save(later, comm, opt)
    comm.allgather_obj(None)
    assert not os.path.exists(later)
    assert not [n for n in os.listdir(root) if _write.is_temporary(n)]
    model = Two(seed=5)
    mnpar.checkpoint.load(path, comm, loader(comm, model))
    assert all(np.array_equal(a, first[n]) for n, a in params(model).items())
