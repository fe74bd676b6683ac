"""Every rank's view of a pipeline agrees, or every rank refuses it with the same message.

build_stage (balance, chunks, loop, the model), PipelineUpdater and
PipelineEvaluator (schedule, micro-batches, stages) at construction, and the
data layout at the first step; the signature rule that says how many inputs
a stage takes, in one process.
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from helpers import Dense, float64

import mnpar
from mnpar.pipeline import PipelineEvaluator, PipelineUpdater, build_stage
from mnpar.pipeline._agreement import input_arity, joint_arity, model_fingerprint

BATCH = 6


@pytest.fixture(scope="module")
def comm():
    c = mnpar.create_communicator("naive", timeout=20)
    yield c
    c.finalize()


def mlp(n_linear):
    np.random.seed(5)
    layers = []
    for _ in range(n_linear):
        layers += [L.Linear(6, 6), F.relu]
    return float64(chainer.Sequential(*layers[:-1]))


def data():
    rng = np.random.RandomState(1)
    return rng.randn(BATCH, 6), rng.randint(0, 6, BATCH).astype(np.int32)


# -- build_stage ---------------------------------------------------------------------


@pytest.mark.mpi(min_size=2)
def test_a_balance_that_differs_on_one_rank_is_refused_on_every_rank(comm):
    # Regression: rank 0 cut 7 Linear layers where the others cut 6 and trained on.
    n = comm.size
    balance = [2] * (n - 1) + [3] if comm.rank else [3] + [2] * (n - 1)
    with pytest.raises(ValueError, match=r"build_stage: the ranks disagree: balance "
                                         rf"\[3(, 2){{{n - 1}}}\] on rank 0; "
                                         rf"\[(2, ){{{n - 1}}}3\] on ranks? 1.* same balance, "
                                         r"chunks and loop"):
        build_stage(mlp(n + 1), balance, comm)


@pytest.mark.mpi(min_size=2)
def test_a_model_that_differs_on_one_rank_is_refused_on_every_rank(comm):
    n = comm.size
    model = mlp(n + 1)
    if comm.rank == 1:  # one more layer, and the same balance's sum would not even fit
        model = chainer.Sequential(*(list(model)[:2] + [L.Linear(6, 4)] + list(model)[3:]))
    with pytest.raises(ValueError, match=r"build_stage: the ranks disagree: layer 2 "
                                         r"Linear\(W \(6, 6\) float64, b \(6,\) float64\) on "
                                         r"ranks? 0.*; Linear\(W \(4, 6\) float32, b \(4,\) "
                                         r"float32\) on rank 1"):
        build_stage(model, [2] * (n - 1) + [3], comm)


@pytest.mark.mpi(min_size=2)
def test_chunks_and_loop_that_differ_are_refused_on_every_rank(comm):
    n = comm.size
    with pytest.raises(ValueError, match=r"the ranks disagree: loop True on rank 0; False on "):
        build_stage(mlp(n + 1), [2] * (n - 1) + [3], comm, loop=comm.rank == 0)
    with pytest.raises(ValueError, match=r"the ranks disagree: chunks 2 on rank 0; 1 on "):
        build_stage(mlp(2 * n), [2] * (2 * n - 1) + [1], comm, chunks=2 if comm.rank == 0 else 1)


def test_the_fingerprint_holds_layer_types_and_parameter_shapes():
    found = model_fingerprint(chainer.Sequential(L.Linear(None, 3), F.relu, L.Linear(3, 2)))
    assert found == [("Linear", (("/W", None, None), ("/b", (3,), "float32"))), ("relu",),
                     ("Linear", (("/W", (2, 3), "float32"), ("/b", (2,), "float32")))]


# -- PipelineUpdater and PipelineEvaluator --------------------------------------------


def stage_and_data(comm, loop=True, layout=None):
    """This rank's stage of a 2n+1-layer MLP (each rank a part), and the dataset it
    iterates: as the pipeline expects, or ``layout(rank, last, x, t)`` where given."""
    n = comm.size
    stage = build_stage(mlp(n + 1), [2] * (n - 1) + [3], comm, loop=loop)
    x, t = data()
    loss_rank = 0 if loop else n - 1
    target = L.Classifier(stage) if comm.rank == loss_rank else stage
    if layout is not None:
        return target, layout(comm.rank, n - 1, x, t)
    if comm.rank == 0 == loss_rank:
        return target, chainer.datasets.TupleDataset(x, t)
    if comm.rank == 0:
        return target, x
    if comm.rank == loss_rank:
        return target, chainer.datasets.TupleDataset(t)
    return target, mnpar.datasets.create_empty_dataset(x)


def updater(comm, target, dataset, k=3, schedule="1f1b", batch=BATCH):
    optimizer = chainer.optimizers.SGD(0.1).setup(target)
    it = chainer.iterators.SerialIterator(dataset, batch, shuffle=False)
    return PipelineUpdater(it, optimizer, comm, k, schedule=schedule)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("differs, match", [
    ("schedule", r"PipelineUpdater: the ranks disagree: schedule 'gpipe' on rank 0; '1f1b' "
                 r"on ranks? 1"),
    ("k", r"PipelineUpdater: the ranks disagree: n_microbatches 2 on rank 0; 3 on ranks? 1"),
    ("stage", r"PipelineUpdater: the ranks disagree: stages \(build_stage's balance, chunks, "
              r"loop, model\) None on rank 0; \(\[2.*\], 1, True, \d+\) on ranks? 1"),
])
def test_an_updater_whose_ranks_differ_is_refused_on_every_rank(comm, differs, match):
    target, dataset = stage_and_data(comm)
    first = comm.rank == 0
    if differs == "stage" and first:  # the same wiring, built by hand
        hand = mnpar.MultiNodeChainList(comm)
        for link, wire in zip(target.predictor.children(), target.predictor.wiring):
            hand.add_link(link, wire.rank_in, wire.rank_out)
        target = L.Classifier(hand)
    with pytest.raises(ValueError, match=match):
        updater(comm, target, dataset, k=2 if differs == "k" and first else 3,
                schedule="gpipe" if differs == "schedule" and first else "1f1b")


@pytest.mark.mpi(min_size=2)
def test_a_schedule_unknown_on_one_rank_is_refused_on_every_rank(comm):
    target, dataset = stage_and_data(comm)
    with pytest.raises(ValueError, match="schedule 'fast' on rank 0; '1f1b' on"):
        updater(comm, target, dataset, schedule="fast" if comm.rank == 0 else "1f1b")


@pytest.mark.mpi(min_size=2)
def test_an_evaluator_whose_ranks_differ_is_refused_on_every_rank(comm):
    target, dataset = stage_and_data(comm)
    it = chainer.iterators.SerialIterator(dataset, BATCH, repeat=False, shuffle=False)
    with pytest.raises(ValueError, match=r"PipelineEvaluator: the ranks disagree: "
                                         r"n_microbatches 1 on rank 0; 2 on"):
        PipelineEvaluator(it, target, comm, 1 if comm.rank == 0 else 2)


# -- the data layout, at the first step -------------------------------------------------

LAYOUTS = {
    # loop=False: rank 0 iterates (x, t) as it would with loop=True
    "inputs and labels on the first rank": (False, lambda r, last, x, t: (
        chainer.datasets.TupleDataset(x, t) if r == 0 else
        chainer.datasets.TupleDataset(t) if r == last else
        mnpar.datasets.create_empty_dataset(x)),
        r"rank 0 iterates examples of 2 arrays \(\(6,\) float64, \(\) int32\), where its "
        r"stage takes the inputs only \(1 array\), e.g. x"),
    # loop=False: the last rank iterates (x, t)
    "inputs and labels on the last rank": (False, lambda r, last, x, t: (
        x if r == 0 else chainer.datasets.TupleDataset(x, t) if r == last else
        mnpar.datasets.create_empty_dataset(x)),
        r"rank \d iterates examples of 2 arrays \(\(6,\) float64, \(\) int32\), where its "
        r"stage takes the labels only, e.g. chainer.datasets.TupleDataset\(t\)"),
    # loop=True: rank 1 iterates the whole dataset instead of an empty one
    "data on a rank without inputs": (True, lambda r, last, x, t: (
        chainer.datasets.TupleDataset(x, t) if r in (0, 1) else
        mnpar.datasets.create_empty_dataset(x)),
        r"rank 1 iterates examples of 2 arrays .* where its stage takes no data: "
        r"mnpar.datasets.create_empty_dataset"),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_data_that_does_not_fit_the_stages_is_refused_on_every_rank(comm, case):
    loop, layout, match = LAYOUTS[case]
    target, dataset = stage_and_data(comm, loop, layout)
    run = updater(comm, target, dataset)
    expected = (r"Every rank iterates a dataset of the same length with the same batch size: "
                r"rank 0: the inputs .*; rank 1: ")
    with pytest.raises(ValueError, match=rf"PipelineUpdater: the data does not fit the "
                                         rf"pipeline's stages: .*{match}.*{expected}"):
        run.update()
    run.finalize()


@pytest.mark.mpi(min_size=2)
def test_batch_sizes_that_differ_are_refused_on_every_rank(comm):
    target, dataset = stage_and_data(comm)
    run = updater(comm, target, dataset, batch=BATCH if comm.rank else BATCH - 1)
    with pytest.raises(ValueError, match=r"the data does not fit the pipeline's stages: "
                                         r"mini-batches of 5 on rank 0; 6 on ranks? 1"):
        run.update()
    run.finalize()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("loop", [True, False])
def test_the_expected_layout_trains(comm, loop):
    target, dataset = stage_and_data(comm, loop)
    run = updater(comm, target, dataset)
    run.update()
    run.update()  # checked once: the second step gathers nothing
    assert run.runner._needs is None
    run.finalize()


def test_how_many_inputs_a_stage_takes():
    class Pair(chainer.Chain):
        def forward(self, x, y, mask=None, scale=2.0):
            return x

    class Any_(chainer.Chain):
        def forward(self, *xs):
            return xs[0]

    assert input_arity(L.Linear(3, 3)) == (1, 1)  # n_batch_axes=1 is an option
    assert input_arity(chainer.Sequential(L.Linear(3, 3), F.relu)) == (1, 1)
    assert input_arity(Dense(3, 3)) == (1, 1)
    assert input_arity(Pair()) == (2, 3)
    assert input_arity(Any_()) is None
    assert input_arity(chainer.Sequential()) is None
    assert input_arity(lambda x: x) == (1, 1)
    assert joint_arity([(1, 1), None, (1, 3)]) == (1, 1)
    assert joint_arity([None]) is None
