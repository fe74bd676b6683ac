"""Balance proposals: the exact cut, and profiling a Sequential (one process)."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

from mnpar.pipeline import balance_by_size, balance_by_time, solve


def test_the_cut_minimises_the_largest_part():
    assert solve([1, 1, 1, 1], 2) == [2, 2]
    assert solve([4, 1, 1, 1, 1], 2) == [1, 4]
    assert solve([1, 2, 3, 4, 5], 3) == [3, 1, 1]  # 6 | 4 | 5
    assert solve([5], 1) == [1]


def test_more_parts_than_layers_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot cut 2 layers into 3 parts"):
        solve([1, 1], 3)


def _model():
    np.random.seed(0)
    return chainer.Sequential(L.Linear(8, 256), F.relu, L.Linear(256, 256), F.relu,
                              L.Linear(256, 4))


@pytest.mark.parametrize("propose", [balance_by_time, balance_by_size])
def test_proposals_cover_every_layer(propose):
    x = np.random.RandomState(0).randn(32, 8).astype(np.float32)
    balance = propose(2, _model(), x)
    assert len(balance) == 2 and sum(balance) == 5 and min(balance) >= 1


def test_size_balance_follows_the_parameters():
    x = np.zeros((2, 8), np.float32)
    model = chainer.Sequential(L.Linear(8, 8), L.Linear(8, 8), L.Linear(8, 512),
                               L.Linear(512, 512))
    assert balance_by_size(2, model, x) == [3, 1]
