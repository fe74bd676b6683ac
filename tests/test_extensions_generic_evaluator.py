"""GenericMultiNodeEvaluator: uneven shards, results on the root, ChainerMN's order."""

import chainer
import numpy as np
import pytest
from helpers import chainermn_and_comm

from mnpar.extensions import GenericMultiNodeEvaluator


def shard(rank):
    """Rank r holds 3 + 5r examples: more than 8 rounds apart at 3 ranks."""
    n = 3 + 5 * rank
    return chainer.datasets.TupleDataset(np.full((n, 2), rank, np.float32),
                                         np.arange(n, dtype=np.int32))


def iterator(rank):
    return chainer.iterators.SerialIterator(shard(rank), 1, repeat=False, shuffle=False)


def target(x, t):
    return int(x[0, 0]), int(t[0])  # (rank, index): where each result came from


@pytest.mark.mpi(min_size=1)
def test_the_root_gets_every_ranks_results_round_by_round(mcomm):
    results = GenericMultiNodeEvaluator(mcomm, iterator(mcomm.rank), target)()
    if mcomm.rank != 0:
        assert results is None
        return
    longest = 3 + 5 * (mcomm.size - 1)
    expected = [(r, i) for i in range(longest) for r in range(mcomm.size) if i < 3 + 5 * r]
    assert results == expected


@pytest.mark.mpi(min_size=1)
def test_aggregate_sees_the_list_chainermns_sees(mcomm):
    chainermn, theirs_comm = chainermn_and_comm()
    ours = GenericMultiNodeEvaluator(mcomm, iterator(mcomm.rank), target, root=mcomm.size - 1)
    theirs = chainermn.extensions.GenericMultiNodeEvaluator(
        theirs_comm, iterator(mcomm.rank), target, root=mcomm.size - 1)
    assert ours(None) == theirs(None)


class Accuracy(GenericMultiNodeEvaluator):
    """Overrides both halves, as users do: only rank 0's examples count as right."""

    def calc_local(self, x, t):
        return int((x[:, 0] == 0).sum()), len(t)

    def aggregate(self, results):
        right, total = map(sum, zip(*results))
        return right / total


@pytest.mark.mpi(min_size=1)
def test_overridden_calc_local_and_aggregate_with_a_progress_hook(mcomm):
    seen = []
    it = chainer.iterators.SerialIterator(shard(mcomm.rank), 2, repeat=False, shuffle=False)
    evaluator = Accuracy(mcomm, it, None, progress_hook=seen.append)
    accuracy = evaluator()
    again = evaluator()  # the iterator is reset
    if mcomm.rank == 0:
        total = sum(3 + 5 * r for r in range(mcomm.size))
        assert accuracy == again == pytest.approx(3 / total)
        assert len(seen) == 2 * 2  # rank 0's two batches, twice
    else:
        assert accuracy is None and seen == []


@pytest.mark.mpi(min_size=2)
def test_a_rank_whose_calc_local_fails_fails_every_rank(mcomm):
    def broken(x, t):
        if mcomm.rank == 1 and int(t[0]) == 2:
            raise ArithmeticError("bad batch")
        return 0

    error = ArithmeticError if mcomm.rank == 1 else RuntimeError
    with pytest.raises(error, match="bad batch"):
        GenericMultiNodeEvaluator(mcomm, iterator(mcomm.rank), broken)()


def test_its_defaults_are_chainermns(comm):
    ev = GenericMultiNodeEvaluator(comm, iterator(0), target)
    assert (ev.trigger, ev.default_name, ev.root) == ((1, "epoch"), "validation", 0)
    assert ev.priority == chainer.training.PRIORITY_WRITER


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(root=1), ValueError, "root=1 is out of range for a communicator of size 1"),
    (dict(root=-1), ValueError, "root=-1 is out of range"),
    (dict(root="0"), TypeError, "root must be an int rank, not str '0'"),
    (dict(progres_hook=print), TypeError, r"unknown keyword\(s\) \['progres_hook'\]"),
])
def test_bad_arguments_are_clear_errors(comm, kwargs, error, match):
    with pytest.raises(error, match=match):
        GenericMultiNodeEvaluator(comm, iterator(0), target, **kwargs)
