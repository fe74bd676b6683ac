"""The messages a split Transformer block sends, layer by layer (``mnpar.tensor.collectives``).

Without sequence parallelism a block makes two allreduces forward (the sums
of the attention's output layer and of the MLP's second layer) and two
backward (the gradients of the inputs of the queries, keys and values, one
allreduce for the three, and of the MLP's first layer). With it, each
allreduce becomes an allgather and a reduce-scatter, and the gradients of
the whole parameters that meet sequence parts (layer normalizations, row
biases) are summed.
"""
import collections

import chainer.links as L
import numpy as np
import pytest
from tensor_models import LM
from test_tensor_parallelize import LM_SIZES, lm_plan, tokens

import mnpar

pytestmark = pytest.mark.mpi(min_size=2)
BLOCK = "/predictor/blocks/0"


def counted(comm, sequence):
    np.random.seed(0)
    model = mnpar.tensor.parallelize(L.Classifier(LM(**dict(LM_SIZES, layers=1))), comm,
                                     lm_plan(sequence))
    x, t = tokens()
    with mnpar.tensor.collectives() as counts:
        model(x, t).backward()
    return counts


def per_layer(counts, prefix):
    out = collections.defaultdict(dict)
    for (layer, op, phase), n in counts.items():
        if layer.startswith(prefix):
            out[layer[len(prefix):]][f"{op} {phase}"] = n
    return dict(out)


def test_a_block_makes_two_allreduces_forward_and_two_backward(mcomm):
    counts = counted(mcomm, None)
    assert per_layer(counts, BLOCK) == {
        "/attention/query": {"allreduce backward": 1},
        "/attention/out": {"allreduce forward": 1},
        "/fc1": {"allreduce backward": 1},
        "/fc2": {"allreduce forward": 1},
    }
    others = {k: v for k, v in per_layer(counts, "/predictor/").items()
              if not k.startswith("blocks")}
    assert others == {"embed": {"allreduce forward": 1}, "output": {"allreduce backward": 1}}
    assert counts[("/", "allreduce", "forward")] == 2  # the loss: max, then the sums
    assert counts[("/", "allgather", "forward")] == 1  # the accuracy


def test_sequence_parallelism_trades_each_allreduce_for_an_allgather_and_a_reduce_scatter(
        mcomm):
    counts = counted(mcomm, 1)
    assert per_layer(counts, BLOCK) == {
        "/attention/query": {"allgather forward": 1, "reduce_scatter backward": 1},
        "/attention/out": {"reduce_scatter forward": 1, "allgather backward": 1,
                           "allreduce backward": 1},
        "/fc1": {"allgather forward": 1, "reduce_scatter backward": 1},
        "/fc2": {"reduce_scatter forward": 1, "allgather backward": 1,
                 "allreduce backward": 1},
        "/ln1": {"allreduce backward": 1},
        "/ln2": {"allreduce backward": 1},
    }
