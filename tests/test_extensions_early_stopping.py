"""MultiNodeEarlyStoppingTrigger: every rank stops at the iteration the mean decides."""

import chainer
import pytest
from helpers import chainermn_and_comm
from test_extensions_observation_aggregator import ReportingUpdater

import mnpar
from mnpar.extensions import MultiNodeEarlyStoppingTrigger

# The mean over ranks improves for 5 iterations, then not: with patience 3
# every rank stops after iteration 8. Each rank's own values swing around
# that mean, so a rank deciding alone would stop elsewhere.
MEAN = [5.0, 4.0, 3.0, 2.0, 1.0, 1.5, 1.6, 1.7, 0.9, 0.8, 0.7, 0.6]


def loss(rank, size):
    swing = (rank - (size - 1) / 2) * 2.0
    return lambda i: MEAN[i - 1] + (swing if i % 2 else -swing)


def stopping_iteration(trigger, values):
    trainer = chainer.training.Trainer(ReportingUpdater(values), trigger)
    trainer.run()
    return trainer.updater.iteration


def multi_node(comm, module=mnpar.extensions, **kwargs):
    return module.MultiNodeEarlyStoppingTrigger(
        comm, check_trigger=(1, "iteration"), patience=3, max_trigger=(12, "iteration"),
        **kwargs)


@pytest.mark.mpi(min_size=1)
def test_every_rank_stops_where_the_mean_says(mcomm):
    stopped = stopping_iteration(multi_node(mcomm), loss(mcomm.rank, mcomm.size))
    assert stopped == 8
    assert mcomm.allgather_obj(stopped) == [8] * mcomm.size


@pytest.mark.mpi(min_size=2)
def test_a_rank_deciding_alone_would_stop_elsewhere(mcomm):
    alone = chainer.training.triggers.EarlyStoppingTrigger(
        check_trigger=(1, "iteration"), patience=3, max_trigger=(12, "iteration"))
    stops = mcomm.allgather_obj(stopping_iteration(alone, loss(mcomm.rank, mcomm.size)))
    assert set(stops) != {8}, stops


@pytest.mark.mpi(min_size=1)
def test_it_stops_where_chainermns_stops(mcomm):
    chainermn, theirs_comm = chainermn_and_comm()
    for mode, values in (("min", loss(mcomm.rank, mcomm.size)),
                         ("max", lambda i: -loss(mcomm.rank, mcomm.size)(i))):
        ours = stopping_iteration(multi_node(mcomm, mode=mode), values)
        theirs = stopping_iteration(multi_node(theirs_comm, chainermn.extensions, mode=mode),
                                    values)
        assert ours == theirs == 8, mode


@pytest.mark.mpi(min_size=1)
def test_max_trigger_ends_training_that_keeps_improving(mcomm):
    trigger = multi_node(mcomm)
    assert stopping_iteration(trigger, lambda i: 100.0 - i) == 12
    assert trigger.get_training_length() == (12, "iteration")


def test_patients_is_an_alias_of_patience(comm):
    trigger = MultiNodeEarlyStoppingTrigger(comm, patients=5)
    assert trigger.actual_trigger.patience == 5
    assert trigger.actual_trigger.monitor == "main/loss_aggregated"
    assert trigger.aggregator.aggregated_key == "main/loss_aggregated"


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(mode="minimum"), ValueError, r"mode='minimum' is not one of \('auto', 'min', 'max'\)"),
    (dict(patience=-1), ValueError, "patience=-1 must not be negative"),
    (dict(patience=2.5), TypeError, "patience=2.5 must be an int"),
    (dict(patients="3"), TypeError, "patients='3' must be an int"),
    (dict(monitor=None), TypeError, "monitor=None"),
    (dict(patience=3, patients=3), TypeError, "Both 'patience' and 'patients'"),
])
def test_bad_arguments_are_clear_errors(comm, kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiNodeEarlyStoppingTrigger(comm, **kwargs)


def test_a_communicator_is_required():
    with pytest.raises(TypeError,
                       match="MultiNodeEarlyStoppingTrigger needs an mnpar communicator"):
        MultiNodeEarlyStoppingTrigger("comm")
