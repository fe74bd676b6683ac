"""What the sharded-state tests share: small float64 models, global batches, and how to
read a rank's shards back against a plain data-parallel twin."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

import mnpar

ROWS = 3  # examples per rank
OPTIMIZERS = {
    "Adam": lambda: chainer.optimizers.Adam(alpha=0.01),
    "MomentumSGD": lambda: chainer.optimizers.MomentumSGD(lr=0.1),
    "AdaGrad": lambda: chainer.optimizers.AdaGrad(lr=0.1),
    "RMSprop": lambda: chainer.optimizers.RMSprop(lr=0.01),
}


class Net(chainer.Chain):
    """5 -> 7 -> 2 -> 3, sizes no rank count from 2 to 4 divides (42, 16, 9 elements per
    link, 67 in all), and a link never called (its gradient stays None)."""

    def __init__(self, seed=0, dtype=np.float64):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(5, 7)
            self.l2 = L.Linear(7, 2)
            self.l3 = L.Linear(2, 3)
            self.unused = L.Linear(2, 2)
        rng = np.random.RandomState(seed)
        for p in self.params():
            p.array = rng.standard_normal(p.shape).astype(dtype)

    def forward(self, x, t):
        h = F.tanh(self.l2(F.relu(self.l1(x))))
        return F.softmax_cross_entropy(self.l3(h), t)


def batch(step, lo, hi, dtype=np.float64):
    """Rows ``lo:hi`` of the global batch of ``step`` (the same on every rank)."""
    rng = np.random.RandomState(100 + step)
    x = rng.standard_normal((64, 5)).astype(dtype)
    t = rng.randint(0, 3, 64).astype(np.int32)
    return x[lo:hi], t[lo:hi]


def local(comm, step, dtype=np.float64):
    return batch(step, comm.rank * ROWS, (comm.rank + 1) * ROWS, dtype)


def shards(opt):
    """``{name: (start, stop, array)}``: this rank's shard of every parameter (a sharded
    optimizer), read from the mirror the wrapped optimizer updates."""
    out = {}
    for g in opt.groups:
        for slot, name in enumerate(g.names):
            piece = g.pieces[slot]
            shard = opt.mirror.shard_of(g.params[slot])
            out[name] = (piece.start, piece.stop, shard.array)
    return out


def assert_matches(opt, ref, exact, **tol):
    """The sharded optimizer's model (or its shards, in stage 3) equals ``ref``: bit for
    bit where ``exact``, else to ``tol``."""
    ref_params = dict(ref.namedparams())
    for name, (start, stop, shard) in shards(opt).items():
        want = ref_params[name].array.reshape(-1)[start:stop]
        if exact:
            assert np.array_equal(shard, want), name
        else:
            np.testing.assert_allclose(shard, want, err_msg=name, **tol)
    if opt.stage < 3:
        for name, p in opt.target.namedparams():
            if exact:
                assert np.array_equal(p.array, ref_params[name].array), name
            else:
                np.testing.assert_allclose(p.array, ref_params[name].array, err_msg=name, **tol)


def train(comm, stage, make_optimizer, hooks=(), steps=3, model=None, **kwargs):
    """``steps`` updates of ``Net`` over ``comm`` at ``stage`` (0: plain data parallelism)."""
    model = Net() if model is None else model
    opt = mnpar.create_multi_node_optimizer(make_optimizer(), comm, stage=stage, **kwargs)
    opt.setup(model)
    for hook in hooks:
        opt.add_hook(hook(comm, model))
    dtype = next(iter(opt.mirror.params())).dtype if stage == 3 else model.l1.W.dtype
    for step in range(steps):
        opt.update(model, *local(comm, step, dtype))
    return model, opt
