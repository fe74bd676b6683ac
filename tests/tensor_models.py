"""Small models the tensor-parallel tests split, written as for one process; the
Transformer is the example's."""
import importlib.util
import os

import chainer
import chainer.functions as F
import chainer.links as L

_spec = importlib.util.spec_from_file_location("tensor_parallel_model", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
    "tensor_parallel", "model.py"))
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)
Attention, Block, norm = _example.Attention, _example.Block, _example.norm


class MLP(chainer.Chain):
    """``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` with ReLUs."""

    def __init__(self, *sizes, dropout=0.0, lazy=False):
        super().__init__()
        self.n = len(sizes) - 1
        self.dropout = dropout
        with self.init_scope():
            for i in range(self.n):
                setattr(self, f"l{i}", L.Linear(None if lazy else sizes[i], sizes[i + 1]))

    def forward(self, x):
        for i in range(self.n):
            x = getattr(self, f"l{i}")(x)
            if i < self.n - 1:
                x = F.relu(x)
                if self.dropout:
                    x = F.dropout(x, self.dropout)
        return x


class LM(_example.LanguageModel):
    """The example's language model (``examples/tensor_parallel/model.py``, which also
    gives ``Block``, ``Attention`` and ``norm``), without dropout unless given."""

    def __init__(self, vocabulary, d, heads, hidden, layers, length, dropout=0.0):
        super().__init__(vocabulary, d, heads, hidden, layers, length, dropout)


class CNN(chainer.Chain):
    """A VGG-style network: two blocks of two 3x3 convolutions and a pooling, then two
    fully connected layers."""

    def __init__(self, channels=(3, 6, 5, 7, 4), hidden=9, classes=5, size=8):
        super().__init__()
        c = channels
        with self.init_scope():
            self.conv1 = L.Convolution2D(c[0], c[1], 3, pad=1)
            self.conv2 = L.Convolution2D(c[1], c[2], 3, pad=1)
            self.conv3 = L.Convolution2D(c[2], c[3], 3, pad=1)
            self.conv4 = L.Convolution2D(c[3], c[4], 3, pad=1)
            self.fc1 = L.Linear(c[4] * (size // 4) ** 2, hidden)
            self.fc2 = L.Linear(hidden, classes)

    def forward(self, x):
        h = F.max_pooling_2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        h = F.max_pooling_2d(F.relu(self.conv4(F.relu(self.conv3(h)))), 2)
        return self.fc2(F.relu(self.fc1(h)))
