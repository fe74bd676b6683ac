"""Memory at the formula: the model state each rank holds, counted array by array.

float32 Adam, bytes a parameter: 16 plain, 8 + 8/N stage 1, 4 + 12/N stage 2,
16/N stage 3, each category within 5% (the shards of a model of 62,000
parameters differ by a few elements); stage 3's gathered links stay within
the stated bound (the running link and the one prefetched).
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import mnpar
from mnpar.optimizers import state_bytes
from mnpar.optimizers._state_bytes import formula

pytestmark = pytest.mark.mpi(min_size=1)


@pytest.fixture(scope="module")
def world():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


@pytest.fixture(params=[1, pytest.param(2, marks=pytest.mark.mpi(min_size=2)),
                        pytest.param(4, marks=pytest.mark.mpi(min_size=4))])
def comm(request, world):
    """A communicator of 1, 2 or 4 ranks (the ranks beyond it wait the test out)."""
    n = request.param
    sub = world.split(int(world.rank >= n), world.rank)
    yield sub if world.rank < n else None
    sub.finalize()


class Mlp(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(101, 300)
            self.l2 = L.Linear(300, 100)
            self.l3 = L.Linear(100, 7)

    def forward(self, x, t):
        return F.softmax_cross_entropy(self.l3(F.relu(self.l2(F.relu(self.l1(x))))), t)


def data(comm):
    rng = np.random.RandomState(comm.rank)
    return rng.randn(4, 101).astype(np.float32), rng.randint(0, 7, 4).astype(np.int32)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_state_bytes_at_the_formula(comm, stage):
    if comm is None:
        return
    np.random.seed(0)
    model = Mlp()
    n = sum(p.size for p in model.params())
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), comm, stage=stage)
    opt.setup(model)
    for _ in range(2):
        opt.update(model, *data(comm))
    used = state_bytes(opt)._asdict()
    for key, want in formula(stage, comm.size, n).items():
        assert abs(used[key] - want) <= 0.05 * want, (key, used[key], want)
    assert used["gathered"] == 0


@pytest.mark.parametrize("reshard", [True, False])
def test_stage3_gathers_at_most_two_links_at_a_time(comm, reshard):
    if comm is None:
        return
    np.random.seed(0)
    model = Mlp()
    links = sorted((sum(p.size for p in link.params()) * 4 for link in model.children()),
                   reverse=True)
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), comm, stage=3,
                                            reshard_after_forward=reshard).setup(model)
    for _ in range(3):
        opt.update(model, *data(comm))
    peak = state_bytes(opt).peak_gathered
    if reshard:  # the running link and the one prefetched
        assert links[0] <= peak <= links[0] + links[1]
    else:  # every link from its forward to its backward, as plain data parallelism
        assert peak == sum(links)
