"""What lives around a split model: gradient clipping by the whole model's norm, and
snapshots of whole arrays that resume in one process and at any other degree."""
import chainer
import chainer.links as L
import numpy as np
import pytest
from tensor_models import LM, MLP
from tensor_twins import Twins, build, close, compare_params, group_fixture  # noqa: F401
from test_tensor_parallelize import LM_SIZES, lm_plan, tokens

import mnpar

pytestmark = pytest.mark.mpi(min_size=1)
T = mnpar.tensor


@pytest.mark.parametrize("degree", [pytest.param(d, marks=pytest.mark.mpi(min_size=d))
                                    for d in (1, 2, 3)])
def test_gradient_clipping_counts_parts_once_and_whole_parameters_once(group, degree):
    comm = group(degree)
    if comm is None:
        return
    x = np.random.RandomState(1).standard_normal((6, 6))
    t = np.random.RandomState(2).randint(0, 4, 6).astype(np.int32)
    twins = Twins(comm, lambda: L.Classifier(MLP(6, 9, 5, 4)),
                  {"predictor/l0": "column", "predictor/l1": "row"})
    ref_hook = chainer.optimizer_hooks.GradientClipping(0.05)
    ours_hook = mnpar.optimizer_hooks.GradientClipping(comm, 0.05)
    optimizers = []
    for model, hook in ((twins.ref, ref_hook), (twins.ours, ours_hook)):
        opt = chainer.optimizers.SGD(lr=0.1).setup(model)
        opt.add_hook(hook)
        optimizers.append(opt)
    for _ in range(2):
        twins.step(x, t)  # outputs and gradients compared
        norm = np.sqrt(sum(float((p.grad ** 2).sum()) for p in twins.ref.params()))
        for opt in optimizers:
            opt.update()
        close(ours_hook.norm, norm, 1e-10, "the whole model's norm")
        assert norm > 0.05  # it clipped
        compare_params(twins.ours, twins.ref, grads=False)


def save(path, model, optimizer):
    s = chainer.serializers.DictionarySerializer()
    model.serialize(s["model"])
    optimizer.serialize(s["optimizer"])
    np.savez(path, **s.target)


def load(path, model, optimizer):
    with np.load(path) as f:
        d = chainer.serializers.NpzDeserializer(f)
        model.serialize(d["model"])
        optimizer.serialize(d["optimizer"])


def lm():
    return L.Classifier(LM(**dict(LM_SIZES, dropout=0.2)))


def train(model, optimizer, steps, x, t):
    with mnpar.random.scope(model, optimizer, seed=7):
        for _ in range(steps):
            loss = model(x, t)
            model.cleargrads()
            loss.backward()
            optimizer.update()


@pytest.mark.mpi(min_size=2)
def test_a_snapshot_at_degree_2_resumes_in_one_process_and_at_other_degrees(group, tmp_path):
    world = mnpar.create_communicator("naive", timeout=30)
    folder = world.bcast_obj(str(tmp_path))
    x, t = tokens()
    ref = build(lm)
    ref_opt = chainer.optimizers.Adam().setup(ref)
    train(ref, ref_opt, 5, x, t)  # the run without a break, in one process
    two = group(2)
    if two is not None:
        model = T.parallelize(build(lm), two, lm_plan())
        opt = chainer.optimizers.Adam().setup(model)
        train(model, opt, 2, x, t)
        save(f"{folder}/snapshot.{two.rank}.npz", model, opt)
    world.allgather_obj(None)  # every snapshot is written
    with np.load(f"{folder}/snapshot.1.npz") as f:
        assert f["model/predictor/embed/W"].shape == (LM_SIZES["vocabulary"], LM_SIZES["d"])
        assert f["optimizer/predictor/output/W/m"].shape == (LM_SIZES["vocabulary"],
                                                             LM_SIZES["d"])
    one = build(lm)  # in one process, from rank 1's file: every file holds whole arrays
    one_opt = chainer.optimizers.Adam().setup(one)
    load(f"{folder}/snapshot.1.npz", one, one_opt)
    train(one, one_opt, 3, x, t)
    compare_params(one, ref, grads=False)
    for degree in range(1, world.size + 1):
        comm = group(degree)
        if comm is None:
            continue
        model = T.parallelize(build(lm), comm, lm_plan())
        opt = chainer.optimizers.Adam().setup(model)
        load(f"{folder}/snapshot.0.npz", model, opt)
        assert opt.t == 2
        train(model, opt, 3, x, t)
        compare_params(model, ref, grads=False)
    world.finalize()
