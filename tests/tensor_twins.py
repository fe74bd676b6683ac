"""A model in one process and its split twin: what the tensor-parallel tests compare.

``Twins(comm, make, plan)`` builds ``make()`` twice from one seed in float64,
splits one over ``comm`` with ``plan``; ``step(*inputs)`` runs a forward and
backward on both (and an optimizer update, if given) and compares the loss,
every gradient (a cut parameter's with its part of the one-process one) and,
after updates, every parameter.
"""
import chainer
import numpy as np
import pytest

import mnpar
from mnpar.tensor._params import cut_of


@pytest.fixture(scope="module", name="group")
def group_fixture():
    """``group(d)``: a communicator of world ranks 0..d-1 (None on the others), made once
    per degree and module."""
    world = mnpar.create_communicator("naive", timeout=30)
    made = {}

    def of(degree):
        if degree > world.size:
            return None
        if degree not in made:
            made[degree] = world.split(int(world.rank >= degree), world.rank)
        return made[degree] if world.rank < degree else None

    yield of
    for c in made.values():
        c.finalize()
    world.finalize()


def close(actual, expected, tol, what):
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    scale = max(1.0, float(np.abs(expected).max(initial=0)))
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale, err_msg=what)


def build(make, dtype=np.float64, seed=0):
    np.random.seed(seed)
    with chainer.using_config("dtype", dtype):
        return make()


def part_of(param, whole):
    cut = cut_of(param)
    return whole if cut is None else cut.part(whole)


def compare_params(ours, ref, tol=1e-10, grads=True):
    theirs = dict(ref.namedparams())
    names = [n for n, _ in ours.namedparams()]
    assert sorted(names) == sorted(theirs), (names, sorted(theirs))
    for name, p in ours.namedparams():
        q = theirs[name]
        close(p.array, part_of(p, q.array), tol, f"{name} (values)")
        if grads:
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                close(p.grad, part_of(p, q.grad), tol, f"{name} (gradient)")


class Twins:
    """``make()`` in one process (``ref``) and split over ``comm`` (``ours``)."""

    def __init__(self, comm, make, plan, optimizer=None, dtype=np.float64, tol=1e-10):
        self.ref = build(make, dtype)
        self.ours = mnpar.tensor.parallelize(build(make, dtype), comm, plan)
        self.dtype = dtype
        self.tol = tol
        self.optimizers = None
        if optimizer is not None:
            self.optimizers = [optimizer().setup(m) for m in (self.ref, self.ours)]

    def step(self, *inputs, scopes=None):
        """One forward, backward (and update) of both; their losses, compared."""
        losses = []
        for i, model in enumerate((self.ref, self.ours)):
            np.random.seed(5)  # lazily drawn weights: the same draw for both
            with chainer.using_config("dtype", self.dtype):
                with (scopes[i] if scopes else _nothing()):
                    loss = model(*inputs)
                    model.cleargrads()
                    loss.backward()
            losses.append(loss)
        close(losses[1].array, losses[0].array, self.tol, "loss")
        compare_params(self.ours, self.ref, self.tol)
        if self.optimizers:
            for opt in self.optimizers:
                opt.update()
            compare_params(self.ours, self.ref, self.tol, grads=False)
        return losses


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
