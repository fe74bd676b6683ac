"""ObservationAggregator: one value per trigger, the same on every rank, as ChainerMN's."""

import chainer
import numpy as np
import pytest
from helpers import chainermn_and_comm

import mnpar
from mnpar.extensions import ObservationAggregator


class ReportingUpdater(chainer.training.StandardUpdater):
    """Reports ``values(iteration)`` as ``main/loss``; no model, no data."""

    def __init__(self, values):
        self.iteration = 0
        self.values = values

    @property
    def epoch(self):
        return self.iteration // 4

    @property
    def epoch_detail(self):
        return self.iteration / 4

    @property
    def previous_epoch_detail(self):
        return (self.iteration - 1) / 4 if self.iteration else None

    @property
    def is_new_epoch(self):
        return self.iteration % 4 == 0

    def connect_trainer(self, trainer):
        pass

    def get_all_optimizers(self):
        return {}

    def update(self):
        self.iteration += 1
        value = self.values(self.iteration)
        if value is not None:
            chainer.report({"main/loss": value})

    def finalize(self):
        pass

    def serialize(self, serializer):
        pass


def record(trainer, key):
    """Collects ``trainer.observation[key]`` (or None) after every iteration."""
    seen = []

    @chainer.training.make_extension(trigger=(1, "iteration"),
                                     priority=chainer.training.PRIORITY_READER)
    def look(t):
        seen.append(t.observation.get(key))

    trainer.extend(look)
    return seen


def run(comm, values, stop=6, module=mnpar.extensions, **kwargs):
    trainer = chainer.training.Trainer(ReportingUpdater(values), (stop, "iteration"))
    trainer.extend(module.ObservationAggregator(comm, "main/loss", "main/loss_all", **kwargs))
    seen = record(trainer, "main/loss_all")
    trainer.run()
    return seen


def value_of(rank):
    return lambda i: float(10 * rank + i)


@pytest.mark.mpi(min_size=1)
def test_every_rank_reports_the_mean_of_all_ranks_values_at_the_trigger(mcomm):
    seen = run(mcomm, value_of(mcomm.rank), comm_trigger=(2, "iteration"))
    ranks = range(mcomm.size)
    means = {i: np.mean([10 * r + j for r in ranks for j in (i - 1, i)]) for i in (2, 4, 6)}
    assert seen == [None, means[2], None, means[4], None, means[6]]
    assert mcomm.allgather_obj(seen) == [seen] * mcomm.size


@pytest.mark.mpi(min_size=1)
def test_the_values_equal_chainermns(mcomm):
    chainermn, theirs_comm = chainermn_and_comm()
    ours = run(mcomm, value_of(mcomm.rank), comm_trigger=(3, "iteration"))
    theirs = run(theirs_comm, value_of(mcomm.rank), module=chainermn.extensions,
                 comm_trigger=(3, "iteration"))
    assert ours == theirs and ours[2] is not None


@pytest.mark.mpi(min_size=1)
def test_variables_are_sent_as_arrays_and_a_custom_aggregator_runs_once(mcomm):
    calls = []

    def largest(xs):
        calls.append(xs)
        return max(float(v) for per_rank in xs for v in per_rank)

    seen = run(mcomm, lambda i: chainer.Variable(np.array(mcomm.rank + i, np.float32)), stop=2,
               comm_trigger=(2, "iteration"), aggregator=largest)
    assert seen == [None, mcomm.size - 1 + 2]
    if mcomm.rank == 0:
        assert len(calls) == 1 and all(isinstance(v, np.ndarray) for v in calls[0][0])
    else:
        assert calls == []


@pytest.mark.mpi(min_size=1)
def test_without_values_nothing_is_reported(mcomm):
    assert run(mcomm, lambda i: None, stop=2) == [None, None]


@pytest.mark.mpi(min_size=2)
def test_ranks_without_values_do_not_count(mcomm):
    seen = run(mcomm, lambda i: 1.0 if mcomm.rank == 0 else None, stop=2)
    assert seen == [1.0, 1.0]


@pytest.mark.mpi(min_size=1)
def test_an_aggregator_that_fails_on_the_root_fails_every_rank(mcomm):
    def broken(xs):
        raise ZeroDivisionError("nothing to divide")

    error = ZeroDivisionError if mcomm.rank == 0 else RuntimeError
    with pytest.raises(error, match="nothing to divide"):
        run(mcomm, value_of(mcomm.rank), aggregator=broken)


def test_it_overwrites_the_original_key_by_default(comm):
    agg = ObservationAggregator(comm, "main/loss")
    assert agg.aggregated_key == "main/loss"
    assert agg.priority == chainer.training.PRIORITY_EDITOR


@pytest.mark.parametrize("args, kwargs, error, match", [
    (("comm", "main/loss"), {}, TypeError, "ObservationAggregator needs an mnpar communicator"),
    ((None, 3), {}, TypeError, "original_key=3 must be an observation's name"),
    ((None, "a", 3), {}, TypeError, "aggregated_key=3"),
    ((None, "a"), dict(aggregator="mean"), TypeError, "aggregator='mean' must be a function"),
])
def test_bad_arguments_are_clear_errors(comm, args, kwargs, error, match):
    args = tuple(comm if a is None else a for a in args)
    with pytest.raises(error, match=match):
        ObservationAggregator(*args, **kwargs)
