"""A small Transformer language model, written with chainer's links and functions for one
process: the example splits it without changing a line (``mnpar.tensor.transformer_plan``).
"""
import chainer
import chainer.functions as F
import chainer.initializers as I
import chainer.links as L
import numpy as np


def norm(ln, x):
    """Layer normalization of each position of ``(B, T, D)`` (chainer's takes 2-D)."""
    b, d = x.shape[0], x.shape[-1]
    return F.reshape(ln(F.reshape(x, (-1, d))), (b, -1, d))


class Attention(chainer.Chain):
    """Causal multi-head self-attention over ``(B, T, D)``."""

    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads, self.d, self.dropout = heads, d, dropout
        with self.init_scope():
            self.query = L.Linear(d, d)
            self.key = L.Linear(d, d)
            self.value = L.Linear(d, d)
            self.out = L.Linear(d, d)

    def forward(self, x):
        b, size = x.shape[0], self.d // self.heads

        def heads(h):  # (B, T, D) -> (B, heads, T, size)
            return F.transpose(F.reshape(h, (b, -1, self.heads, size)), (0, 2, 1, 3))

        q, k, v = (heads(f(x, n_batch_axes=2)) for f in (self.query, self.key, self.value))
        t = q.shape[2]
        causal = np.triu(np.full((t, t), -1e9, q.dtype), 1)
        p = F.softmax(F.matmul(q, k, transb=True) * (size ** -0.5) + causal, axis=-1)
        if self.dropout:
            p = F.dropout(p, self.dropout)
        o = F.reshape(F.transpose(F.matmul(p, v), (0, 2, 1, 3)), (b, -1, self.d))
        return self.out(o, n_batch_axes=2)


class Block(chainer.Chain):
    """Pre-norm: ``x + attention(ln(x))``, then ``h + mlp(ln(h))``."""

    def __init__(self, d, heads, hidden, dropout):
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


class LanguageModel(chainer.Chain):
    """Character ids ``(B, T)`` to next-character scores ``(B * T, vocabulary)``."""

    def __init__(self, vocabulary, d, heads, hidden, layers, length, dropout):
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
        if self.blocks[0].dropout:
            h = F.dropout(h, self.blocks[0].dropout)
        for block in self.blocks:
            h = block(h)
        return F.reshape(self.output(norm(self.ln, h), n_batch_axes=2), (-1, self.vocabulary))
