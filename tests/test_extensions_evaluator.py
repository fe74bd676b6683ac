"""create_multi_node_evaluator: every rank evaluates its shard; results averaged."""
import chainer
import chainer.links as L
import numpy as np
import pytest
from chainer.training import extensions

import mnpar


def dataset(n):
    rng = np.random.RandomState(0)
    return chainer.datasets.TupleDataset(rng.standard_normal((n, 4)).astype(np.float32),
                                         rng.randint(0, 3, n).astype(np.int32))


def model():
    np.random.seed(0)
    return L.Classifier(L.Linear(4, 3))


def run(evaluator):
    return evaluator()  # registers the model with a reporter, then evaluate()


def evaluate(data, batch_size):
    it = chainer.iterators.SerialIterator(data, batch_size, repeat=False, shuffle=False)
    return extensions.Evaluator(it, model())


@pytest.mark.mpi(min_size=1)
def test_equal_shards_give_the_single_process_result(comm):
    full = dataset(4 * comm.size)
    mine = mnpar.scatter_dataset(full, comm)
    result = run(mnpar.create_multi_node_evaluator(evaluate(mine, 2), comm))
    expected = run(evaluate(full, 2))
    assert sorted(result) == ["main/accuracy", "main/loss"]
    for k in expected:
        np.testing.assert_allclose(result[k], float(expected[k]), rtol=1e-5)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("n", [2, 7])
def test_uneven_and_empty_shards_count_by_their_examples(comm, n):
    # with n=2 at 3 or 4 ranks, some ranks hold no example at all
    full = dataset(n)
    mine = mnpar.scatter_dataset(full, comm, force_equal_length=False)
    result = run(mnpar.create_multi_node_evaluator(evaluate(mine, 1), comm))
    expected = run(evaluate(full, 1))
    for k in expected:
        np.testing.assert_allclose(result[k], float(expected[k]), rtol=1e-5)
    assert comm.allgather_obj(result)[0] == result


@pytest.mark.mpi(min_size=1)
def test_the_trainer_reports_the_averaged_values(comm, tmp_path):
    full = dataset(4 * comm.size)
    mine = mnpar.scatter_dataset(full, comm)
    net = model()
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.0), comm).setup(net)
    train = chainer.iterators.SerialIterator(mine, 2)
    trainer = chainer.training.Trainer(chainer.training.StandardUpdater(train, opt),
                                       (1, "iteration"), out=str(tmp_path))
    test = chainer.iterators.SerialIterator(mine, 2, repeat=False, shuffle=False)
    trainer.extend(mnpar.create_multi_node_evaluator(extensions.Evaluator(test, net), comm),
                   trigger=(1, "iteration"))
    log = extensions.LogReport(trigger=(1, "iteration"))
    trainer.extend(log)
    trainer.run()
    expected = run(evaluate(full, 2))
    np.testing.assert_allclose(log.log[0]["validation/main/loss"],
                               float(expected["main/loss"]), rtol=1e-5)


def test_rejects_an_object_without_evaluate(comm):
    with pytest.raises(TypeError, match="has no evaluate"):
        mnpar.create_multi_node_evaluator(object(), comm)
