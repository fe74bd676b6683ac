"""AllreducePersistent: BatchNormalization's running statistics averaged over ranks."""

import chainer
import chainer.links as L
import numpy as np
import pytest
from helpers import chainermn_and_comm

from mnpar.extensions import AllreducePersistent


class Net(chainer.Chain):
    def __init__(self, extra=False):
        super().__init__()
        with self.init_scope():
            self.bn = L.BatchNormalization(3)
            self.bn64 = L.BatchNormalization(2, dtype=np.float64)
            if extra:
                self.more = L.BatchNormalization(4)


def filled(rank):
    """A Net whose running statistics depend on the rank; N too."""
    net = Net()
    net.bn.avg_mean[...] = np.arange(3) + rank
    net.bn.avg_var[...] = 2.0 * rank
    net.bn64.avg_mean[...] = rank / 3
    net.bn.N = rank
    return net


@pytest.mark.mpi(min_size=1)
def test_float_persistents_become_their_mean_and_n_stays(mcomm):
    net = filled(mcomm.rank)
    AllreducePersistent(net, mcomm)()
    mean_rank = (mcomm.size - 1) / 2
    np.testing.assert_allclose(net.bn.avg_mean, np.arange(3) + mean_rank, rtol=1e-6)
    np.testing.assert_allclose(net.bn.avg_var, 2.0 * mean_rank, rtol=1e-6)
    np.testing.assert_allclose(net.bn64.avg_mean, mean_rank / 3, rtol=1e-12)
    assert net.bn.avg_mean.dtype == np.float32 and net.bn64.avg_mean.dtype == np.float64
    assert net.bn.N == mcomm.rank  # an int: left alone, as in ChainerMN
    assert mcomm.allgather_obj(net.bn.avg_mean.tobytes()) == [net.bn.avg_mean.tobytes()] * \
        mcomm.size


@pytest.mark.mpi(min_size=1)
def test_values_equal_chainermns(mcomm):
    chainermn, theirs_comm = chainermn_and_comm()
    ours, theirs = filled(mcomm.rank), filled(mcomm.rank)
    ours.bn.N = theirs.bn.N = 0  # ChainerMN's own code cannot average a Python int
    AllreducePersistent(ours, mcomm)()
    chainermn.extensions.AllreducePersistent(theirs, theirs_comm)()
    for link in ("bn", "bn64"):
        for name in ("avg_mean", "avg_var"):
            np.testing.assert_allclose(getattr(getattr(ours, link), name),
                                       getattr(getattr(theirs, link), name), rtol=1e-6)


@pytest.mark.mpi(min_size=1)
def test_as_a_trainer_extension_it_runs_before_the_evaluators(mcomm):
    ext = AllreducePersistent(Net(), mcomm)
    assert ext.trigger == (1, "epoch")
    assert ext.priority > chainer.training.extensions.Evaluator.priority


@pytest.mark.mpi(min_size=2)
def test_models_that_differ_across_ranks_are_an_error_on_every_rank(mcomm):
    with pytest.raises(ValueError, match=r"persistent values differ across ranks; '/more/"
                                         r"avg_mean': rank 0 has nothing, rank 1 has "):
        AllreducePersistent(Net(extra=mcomm.rank == 1), mcomm)()


def test_bad_arguments_are_clear_errors(comm):
    with pytest.raises(TypeError, match="AllreducePersistent needs a chainer.Link, not ndarray"):
        AllreducePersistent(np.zeros(3), comm)
    with pytest.raises(TypeError, match="AllreducePersistent needs an mnpar communicator"):
        AllreducePersistent(Net(), None)
