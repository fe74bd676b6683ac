"""DeferredBatchNormalization: running statistics once per mini-batch.

The reference is chainer's own ``L.BatchNormalization`` after one training
forward of the whole mini-batch (float64): after one pipelined update with K
micro-batches the deferred link's ``avg_mean`` and ``avg_var`` equal its
values, for every K. The pipeline tests run each rank as a one-stage
pipeline of its own.
"""
import io

import chainer
import chainer.links as L
import numpy as np
import pytest
from helpers import float64

import mnpar
from mnpar.pipeline import (
    DeferredBatchNormalization,
    PipelineUpdater,
    commit_deferred,
    defer_batch_norm,
)

BATCH = 24
SHAPES = {  # input shape, and the link's size and axis
    "dense": ((BATCH, 5), dict(size=5)),
    "conv": ((BATCH, 3, 4, 2), dict(size=3)),
    "axis": ((BATCH, 3, 4), dict(axis=(0, 2))),
}


@pytest.fixture(scope="module")
def comm():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


def inputs(shape, seed=0):
    """float64 data with a mean well away from zero, as after a ReLU."""
    return np.random.RandomState(seed).randn(*shape) * 2.0 + 3.0


def on_host_float64(link):
    link.to_device("@numpy")
    return float64(link)


def batch_norm(cls, shape_name, **kwargs):
    _, options = SHAPES[shape_name]
    return cls(dtype=np.float64, **options, **kwargs)


def whole_batch(x, finetune=False, **kwargs):
    """chainer's running statistics after one training forward of ``x``."""
    bn = L.BatchNormalization(dtype=np.float64, **kwargs)
    with chainer.using_config("train", True):
        bn(x, finetune=finetune)
    return bn


def assert_same_statistics(link, reference):
    np.testing.assert_allclose(link.avg_mean, reference.avg_mean, rtol=1e-12)
    np.testing.assert_allclose(link.avg_var, reference.avg_var, rtol=1e-12)
    assert link.N == reference.N


@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_a_micro_batch_is_normalized_as_chainer_does_and_statistics_wait(shape_name):
    x = inputs(SHAPES[shape_name][0])[:5]
    deferred = batch_norm(DeferredBatchNormalization, shape_name)
    plain = batch_norm(L.BatchNormalization, shape_name)
    with chainer.using_config("train", True):
        y, expected = deferred(x), plain(x)
    np.testing.assert_allclose(y.array, expected.array, rtol=1e-12, atol=1e-12)
    assert not np.allclose(plain.avg_mean, 0)  # chainer's moved at once
    np.testing.assert_array_equal(deferred.avg_mean, np.zeros_like(deferred.avg_mean))
    np.testing.assert_array_equal(deferred.avg_var, np.ones_like(deferred.avg_var))


@pytest.mark.parametrize("shape_name", sorted(SHAPES))
@pytest.mark.parametrize("finetune", [False, True])
def test_commit_equals_one_forward_of_the_whole_batch(shape_name, finetune):
    shape, options = SHAPES[shape_name]
    x = inputs(shape)
    deferred = batch_norm(DeferredBatchNormalization, shape_name, decay=0.7)
    with chainer.using_config("train", True):
        for part in np.split(x, [3, 5, 13]):  # unequal parts
            deferred(part, finetune=finetune)
    deferred.commit()
    reference = whole_batch(x, finetune, decay=0.7, **options)
    assert_same_statistics(deferred, reference)
    assert deferred.N == (1 if finetune else 0)


def test_evaluation_normalizes_by_the_running_statistics_and_adds_nothing():
    x = inputs((6, 3, 2, 2))
    deferred = DeferredBatchNormalization(3, dtype=np.float64)
    plain = L.BatchNormalization(3, dtype=np.float64)
    for bn in (deferred, plain):
        bn.avg_mean[:] = [1.0, 2.0, 3.0]
        bn.avg_var[:] = [4.0, 0.5, 2.0]
    with chainer.using_config("train", False):
        y, expected = deferred(x), plain(x)
    np.testing.assert_allclose(y.array, expected.array, rtol=1e-12)
    by_hand = (x - deferred.avg_mean[:, None, None]) / np.sqrt(
        deferred.avg_var[:, None, None] + deferred.eps)
    np.testing.assert_allclose(y.array, by_hand, rtol=1e-12)
    deferred.commit()
    np.testing.assert_array_equal(deferred.avg_mean, plain.avg_mean)
    np.testing.assert_array_equal(deferred.avg_var, plain.avg_var)


def test_commit_with_nothing_added_changes_nothing():
    bn = DeferredBatchNormalization(4, dtype=np.float64)
    bn.avg_mean[:] = [0.5, -1.0, 2.0, 0.0]
    bn.avg_var[:] = [1.5, 2.0, 0.25, 3.0]
    mean, var = bn.avg_mean.copy(), bn.avg_var.copy()
    bn.commit()
    np.testing.assert_array_equal(bn.avg_mean, mean)
    np.testing.assert_array_equal(bn.avg_var, var)
    assert bn.N == 0
    with chainer.using_config("train", True):
        bn(inputs((5, 4)))
    bn.commit()
    moved = bn.avg_mean.copy(), bn.avg_var.copy()
    assert not np.allclose(moved[0], mean)
    bn.commit()  # the first commit forgot its inputs
    np.testing.assert_array_equal(bn.avg_mean, moved[0])
    np.testing.assert_array_equal(bn.avg_var, moved[1])


def test_recomputation_flag_adds_nothing():
    x = inputs((BATCH, 5))
    bn = DeferredBatchNormalization(5, dtype=np.float64)
    with chainer.using_config("train", True):
        bn(x)
        with chainer.using_config("in_recomputing", True):
            bn(x)
    bn.commit()
    assert_same_statistics(bn, whole_batch(x, size=5))


def test_mixing_fine_tuning_and_training_before_a_commit_is_a_clear_error():
    bn = DeferredBatchNormalization(5, dtype=np.float64)
    with chainer.using_config("train", True):
        bn(inputs((4, 5)))
        with pytest.raises(ValueError, match="finetune=True after calls with finetune=False"):
            bn(inputs((4, 5)), finetune=True)


def test_serialization_is_chainer_batch_normalization_s():
    deferred = DeferredBatchNormalization(3, dtype=np.float64)
    with chainer.using_config("train", True):
        deferred(inputs((8, 3)))
    deferred.commit()
    saved = io.BytesIO()
    chainer.serializers.save_npz(saved, deferred)
    saved.seek(0)
    plain = L.BatchNormalization(3, dtype=np.float64)
    chainer.serializers.load_npz(saved, plain)
    for name in ("avg_mean", "avg_var"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(deferred, name))
    assert not np.allclose(plain.avg_mean, 0)


class OwnBatchNorm(L.BatchNormalization):
    pass


def test_defer_batch_norm_changes_plain_batch_norms_only_and_in_place():
    model = chainer.Sequential(L.Linear(3, 4), L.BatchNormalization(4),
                               chainer.Sequential(L.BatchNormalization(4)),
                               OwnBatchNorm(4), DeferredBatchNormalization(4))
    kept = model[1]
    gamma = kept.gamma
    names = [name for name, _ in model.namedparams()]
    assert defer_batch_norm(model) == 2
    assert [type(link).__name__ for link in model[1:]] == [
        "DeferredBatchNormalization", "Sequential", "OwnBatchNorm",
        "DeferredBatchNormalization"]
    assert type(model[2][0]) is DeferredBatchNormalization
    assert model[1] is kept and kept.gamma is gamma
    assert [name for name, _ in model.namedparams()] == names
    assert defer_batch_norm(model) == 0


def test_commit_deferred_reaches_nested_links():
    inner = DeferredBatchNormalization(4, dtype=np.float64)
    model = chainer.Sequential(chainer.Sequential(inner))
    x = inputs((6, 4))
    with chainer.using_config("train", True):
        inner(x)
    commit_deferred(model)
    assert_same_statistics(inner, whole_batch(x, size=4))


# -- in a pipeline -------------------------------------------------------------


class Net(chainer.Chain):
    """Linear, then a batch normalization of the class given."""

    def __init__(self, bn_class):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(6, 4, initialW=chainer.initializers.Normal(0.5))
            self.bn = bn_class(4, dtype=np.float64)

    def forward(self, x):
        return self.bn(self.l(x))


def data():
    rng = np.random.RandomState(3)
    return rng.randn(BATCH, 6) + 1.0, rng.randint(0, 4, BATCH).astype(np.int32)


def net(bn_class):
    np.random.seed(7)
    return on_host_float64(Net(bn_class))


def train_once(comm, bn_class, k, **options):
    """A one-stage pipeline of ``Net`` after one update of K micro-batches: the Net."""
    model = net(bn_class)
    chain = mnpar.MultiNodeChainList(comm)
    chain.add_link(model, None, None)
    target = L.Classifier(chain)
    optimizer = chainer.optimizers.SGD(0.1).setup(target)
    it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(*data()), BATCH,
                                          shuffle=False)
    updater = PipelineUpdater(it, optimizer, comm, k, schedule="gpipe", **options)
    updater.update()
    updater.finalize()
    return model


def reference():
    """chainer's BatchNormalization after one forward of the whole mini-batch."""
    model = net(L.BatchNormalization)
    with chainer.using_config("train", True):
        model(data()[0])
    return model.bn


@pytest.mark.mpi
@pytest.mark.parametrize("k", range(1, 9))
def test_pipelined_update_equals_whole_batch_statistics(comm, k):
    bn = train_once(comm, DeferredBatchNormalization, k).bn
    assert type(bn) is DeferredBatchNormalization
    assert_same_statistics(bn, reference())
    assert not np.allclose(bn.avg_mean, 0)  # the statistics did move


@pytest.mark.mpi
def test_plain_batch_norm_in_a_pipeline_moves_once_per_micro_batch(comm):
    # What the deferred link fixes: the comparison above tells the two apart.
    bn = train_once(comm, L.BatchNormalization, 4).bn
    assert not np.allclose(bn.avg_mean, reference().avg_mean, rtol=1e-3)


@pytest.mark.mpi
@pytest.mark.parametrize("checkpoint", ["always", "except_last"])
def test_recomputed_micro_batches_count_once(comm, checkpoint):
    bn = train_once(comm, DeferredBatchNormalization, 4, checkpoint=checkpoint).bn
    assert_same_statistics(bn, reference())


@pytest.mark.mpi
def test_updater_switch_defers_plain_batch_norms(comm):
    bn = train_once(comm, L.BatchNormalization, 5, deferred_batchnorm=True).bn
    assert type(bn) is DeferredBatchNormalization
    assert_same_statistics(bn, reference())
