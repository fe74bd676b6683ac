"""A mini-batch's loss and accuracy from its micro-batches': weighted by share, each once."""
import chainer
import numpy as np

from mnpar.pipeline._microbatch import Head, Losses, Microbatches


def test_losses_weigh_each_micro_batch_by_its_share_and_count_it_once():
    batch = Microbatches(inputs=[(), ()], labels=[np.array([1, 0, 1]), np.array([0, 0])],
                         weights=[0.6, 0.4], train=True, recompute=lambda k: k == 0)
    head = Head(lossfun=None, accfun=lambda y, t: chainer.Variable(np.array((y == t).mean())))
    losses = Losses(batch)
    losses.add(0, chainer.Variable(np.array(2.0)), np.array([1, 0, 0]), head)
    losses.add(0, chainer.Variable(np.array(9.0)), np.array([1, 0, 0]), head)  # recomputed
    losses.add(1, chainer.Variable(np.array(1.0)), np.array([0, 0]), head)
    assert batch.n == 2
    assert np.isclose(losses.loss, 0.6 * 2.0 + 0.4 * 1.0)
    assert np.isclose(losses.accuracy, 0.6 * 2 / 3 + 0.4 * 1.0)


def test_without_accuracy_only_the_loss_adds_up():
    batch = Microbatches([()], [None], [1.0], True, lambda k: False)
    losses = Losses(batch)
    no_accuracy = Head(lossfun=None, accfun=None)
    losses.add(0, chainer.Variable(np.array(3.0, np.float32)), None, no_accuracy)
    assert (losses.loss, losses.accuracy) == (3.0, 0.0)
