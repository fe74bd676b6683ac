"""Small models the tensor-parallel tests split, written as for one process."""
import chainer
import chainer.functions as F
import chainer.initializers as I
import chainer.links as L
import numpy as np


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


def norm(ln, x):
    """A layer normalization of each position of ``(B, T, D)`` (chainer's takes 2-D)."""
    b, d = x.shape[0], x.shape[-1]
    return F.reshape(ln(F.reshape(x, (-1, d))), (b, -1, d))


class Attention(chainer.Chain):
    """Causal multi-head self-attention over ``(B, T, D)``."""

    def __init__(self, d, heads, dropout=0.0):
        super().__init__()
        self.heads, self.d, self.dropout = heads, d, dropout
        with self.init_scope():
            self.query = L.Linear(d, d)
            self.key = L.Linear(d, d)
            self.value = L.Linear(d, d)
            self.out = L.Linear(d, d)

    def forward(self, x):
        b = x.shape[0]
        size = self.d // self.heads

        def heads(h):  # (B, T, D) -> (B, heads, T, size)
            return F.transpose(F.reshape(h, (b, -1, self.heads, size)), (0, 2, 1, 3))

        q, k, v = (heads(f(x, n_batch_axes=2)) for f in (self.query, self.key, self.value))
        t = q.shape[2]
        mask = np.triu(np.full((t, t), -1e9, q.dtype), 1)
        p = F.softmax(F.matmul(q, k, transb=True) * (size ** -0.5) + mask, axis=-1)
        if self.dropout:
            p = F.dropout(p, self.dropout)
        o = F.reshape(F.transpose(F.matmul(p, v), (0, 2, 1, 3)), (b, -1, self.d))
        return self.out(o, n_batch_axes=2)


class Block(chainer.Chain):
    """A pre-norm Transformer block: attention and an MLP, each with a residual."""

    def __init__(self, d, heads, hidden, dropout=0.0):
        super().__init__()
        self.dropout = dropout
        with self.init_scope():
            self.ln1 = L.LayerNormalization(d)
            self.attention = Attention(d, heads, dropout)
            self.ln2 = L.LayerNormalization(d)
            self.fc1 = L.Linear(d, hidden)
            self.fc2 = L.Linear(hidden, d)

    def _drop(self, h):
        return F.dropout(h, self.dropout) if self.dropout else h

    def forward(self, x):
        h = x + self._drop(self.attention(norm(self.ln1, x)))
        m = self.fc2(F.relu(self.fc1(norm(self.ln2, h), n_batch_axes=2)), n_batch_axes=2)
        return h + self._drop(m)


class LM(chainer.Chain):
    """A Transformer language model: ids ``(B, T)`` to scores ``(B * T, vocabulary)``."""

    def __init__(self, vocabulary, d, heads, hidden, layers, length, dropout=0.0):
        super().__init__()
        self.vocabulary = vocabulary
        with self.init_scope():
            self.embed = L.EmbedID(vocabulary, d, initialW=I.Normal(0.1))
            self.position = chainer.Parameter(I.Normal(0.1), (length, d))
            self.blocks = chainer.ChainList(*[Block(d, heads, hidden, dropout)
                                              for _ in range(layers)])
            self.ln = L.LayerNormalization(d)
            self.output = L.Linear(d, vocabulary)

    def forward(self, ids):
        h = self.embed(ids) + self.position[:ids.shape[1]]
        for block in self.blocks:
            h = block(h)
        return F.reshape(self.output(norm(self.ln, h), n_batch_axes=2), (-1, self.vocabulary))


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
