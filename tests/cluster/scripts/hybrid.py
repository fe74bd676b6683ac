"""One rank of test_cluster_hybrid: model-parallel pairs as data-parallel replicas.

::

    world rank   0     1     2     3       on 2 hosts x 2 ranks:
    pair (mp)    0     0     1     1       a pair inside each host
    stage (dp)   0     1     0     1       each stage averaged across the hosts

Two models, both checked against the whole model trained in this process on
both pairs' rows at once (float64):

- send/recv: ``l1`` on the pair's first rank, ``l2`` on its second; one update
  through ``create_multi_node_optimizer`` over ``dp`` (with and without double
  buffering);
- pipeline: ``A, C`` on the first rank, ``B`` on the second, ``PipelineUpdater``
  over ``mp`` with 2 micro-batches, two updates, for every training schedule.

Every communicator is of the kind ``argv[1]`` names (``naive``, ``hierarchical``...). A
mismatch raises, which ends the job; then each rank prints ``RESULT {json}``.
"""
import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from _report import report

import mnpar
from mnpar.pipeline import PipelineUpdater
from mnpar.pipeline._schedule import TRAINING_SCHEDULES

ROWS = 6  # per pair and step
STEPS = 2


def linears(*sizes):
    """Seeded float64 ``Linear`` links: the same weights on every call."""
    rng = np.random.RandomState(0)
    links = [L.Linear(a, b) for a, b in zip(sizes, sizes[1:])]
    for link in links:
        for p in link.params():
            p.array = rng.standard_normal(p.shape)
    return links


def rows(pair, step, pairs):
    """The rows pair ``pair`` reads at ``step`` (all pairs' with ``pair=None``)."""
    rng = np.random.RandomState(7)
    x, t = rng.standard_normal((pairs * STEPS * ROWS, 6)), rng.randint(0, 4, pairs * STEPS * ROWS)
    t = t.astype(np.int32)
    chosen = range(pairs) if pair is None else [pair]
    index = np.concatenate([np.arange(ROWS) + (g * STEPS + step) * ROWS for g in chosen])
    return x[index], t[index]


def reference(pairs, steps, relu_between):
    """The links after ``steps`` SGD updates of the whole model on every pair's rows."""
    links = linears(6, 8, 7, 4) if relu_between else linears(6, 5, 4)
    model = chainer.ChainList(*links)
    opt = chainer.optimizers.SGD(lr=0.5).setup(model)

    def loss(x, t):
        h = x
        for i, link in enumerate(links):
            h = link(h)
            h = F.relu(h) if i < len(links) - 1 else h
        return F.softmax_cross_entropy(h, t)

    for step in range(steps):
        opt.update(loss, *rows(None, step, pairs))
    return links


def arrays(links):
    return [p.array.copy() for link in links for _, p in sorted(link.namedparams())]


def check(got, expected, before, what):
    assert len(got) == len(expected) == len(before) > 0, what
    for a, b, c in zip(got, expected, before):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=what)
        assert not np.allclose(a, c), f"{what}: the update changed nothing"


def send_recv(mp, dp, pairs, double_buffering):
    own = linears(6, 5, 4)[mp.rank]
    before = arrays([own])
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.5), dp,
                                            double_buffering=double_buffering)
    opt.setup(own)
    x, t = rows(dp.rank, 0, pairs)

    def loss():
        if mp.rank == 0:
            phi = mnpar.functions.send(F.relu(own(x)), mp, rank=1)
            y = mnpar.functions.recv(mp, rank=1, delegate_variable=phi)
            return F.softmax_cross_entropy(y, t)
        h = mnpar.functions.recv(mp, rank=0)
        return mnpar.functions.send(own(h), mp, rank=0)

    opt.update(loss)
    if double_buffering:
        opt.flush()
    check(arrays([own]), arrays([reference(pairs, 1, False)[mp.rank]]), before,
          f"send/recv, double_buffering={double_buffering}")


class Dense(chainer.Chain):
    def __init__(self, link, relu):
        super().__init__()
        self.relu = relu
        with self.init_scope():
            self.l = link

    def forward(self, x):
        return F.relu(self.l(x)) if self.relu else self.l(x)


def pipeline(mp, dp, pairs, schedule):
    a, b, c = linears(6, 8, 7, 4)
    m = mnpar.MultiNodeChainList(mp)
    x, t = zip(*[rows(dp.rank, step, pairs) for step in range(STEPS)])
    mine = chainer.datasets.TupleDataset(np.concatenate(x), np.concatenate(t))
    if mp.rank == 0:
        m.add_link(Dense(a, True), None, 1)
        m.add_link(Dense(c, False), 1, None)
        target, dataset, own = L.Classifier(m), mine, [a, c]
    else:
        m.add_link(Dense(b, True), 0, 0)
        target, dataset, own = m, mnpar.datasets.create_empty_dataset(mine), [b]
    before = arrays(own)
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.5), dp)
    opt.setup(target)
    it = chainer.iterators.SerialIterator(dataset, ROWS, shuffle=False)
    updater = PipelineUpdater(it, opt, mp, 2, schedule=schedule)
    for _ in range(STEPS):
        updater.update()
    updater.finalize()
    whole = reference(pairs, STEPS, True)
    expected = [whole[0], whole[2]] if mp.rank == 0 else [whole[1]]
    check(arrays(own), arrays(expected), before, f"pipeline {schedule}")


def main() -> None:
    world = mnpar.create_communicator(sys.argv[1], timeout=30)  # split keeps the kind
    assert world.size % 2 == 0, "pairs of ranks"
    pairs = world.size // 2
    mp = world.split(world.rank // 2, world.rank % 2)
    dp = world.split(world.rank % 2, world.rank // 2)
    checked = []
    for double_buffering in (False, True):
        send_recv(mp, dp, pairs, double_buffering)
        checked.append(f"send/recv double_buffering={double_buffering}")
    for schedule in TRAINING_SCHEDULES:
        pipeline(mp, dp, pairs, schedule)
        checked.append(f"pipeline {schedule}")
    report(rank=world.rank, checked=checked, mp=[mp.rank, mp.size], dp=[dp.rank, dp.size],
           dp_inter=[dp.inter_rank, dp.inter_size], mp_inter=[mp.inter_rank, mp.inter_size])
    for comm in (dp, mp, world):
        comm.finalize()


if __name__ == "__main__":
    main()
