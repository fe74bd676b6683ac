"""The tutorial's seq2seq model: the encoder on rank 0, the decoder on rank 1.

::

    rank 0: source -> embed -> LSTM --(h, c)--> rank 1: LSTM -> linear -> loss
                               ^ MultiNodeNStepRNN, rank_out=1   ^ rank_in=0

Only the LSTMs' final states cross between the ranks (and their gradients
back). Both LSTMs have the same layers and units, so the decoder can start
from the encoder's states. ``DecoderRNN`` and ``word_loss`` let another layout
put the output layer and the loss on a rank of their own (``benchmarks/soak.py``).
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

import mnpar

# isort: split
from corpus import EOS


class Encoder(chainer.Chain):
    """Rank 0: reads the source sentences; returns the delegate as its "loss"."""

    def __init__(self, comm, n_vocab, n_layers, n_units, dropout):
        super().__init__()
        with self.init_scope():
            self.embed = L.EmbedID(n_vocab, n_units)
            self.rnn = mnpar.links.create_multi_node_n_step_rnn(
                L.NStepLSTM(n_layers, n_units, n_units, dropout), comm,
                rank_in=None, rank_out=1)

    def forward(self, *xs):
        exs = sequence_embed(self.embed, xs)
        _, _, _, delegate = self.rnn(exs)
        return delegate  # backward() on it receives the states' gradients from rank 1

    def encode(self, xs):
        """Sends the states of ``xs`` to the decoder, for translation."""
        with chainer.no_backprop_mode(), chainer.using_config("train", False):
            self.rnn(sequence_embed(self.embed, xs))


class DecoderRNN(chainer.Chain):
    """The decoder up to its output layer: the LSTM's state at every target position.

    :class:`Decoder` adds the output layer and the loss; on its own it is the
    middle rank of a three-rank chain (``benchmarks/soak.py``).
    """

    def __init__(self, comm, n_vocab, n_layers, n_units, dropout):
        super().__init__()
        with self.init_scope():
            self.embed = L.EmbedID(n_vocab, n_units)
            self.rnn = mnpar.links.create_multi_node_n_step_rnn(
                L.NStepLSTM(n_layers, n_units, n_units, dropout), comm,
                rank_in=0, rank_out=None)

    def forward(self, *ys):
        """The states that predict ``w1 w2 ... <eos>`` from ``<eos> w1 w2 ...``: one row a word."""
        eos = self.xp.array([EOS], np.int32)
        inputs = [self.xp.concatenate([eos, y]) for y in ys]
        _, _, os, _ = self.rnn(sequence_embed(self.embed, inputs))
        return F.concat(os, axis=0)


class Decoder(DecoderRNN):
    """Rank 1: predicts each target word from the words before and the encoder's state."""

    def __init__(self, comm, n_vocab, n_layers, n_units, dropout):
        super().__init__(comm, n_vocab, n_layers, n_units, dropout)
        with self.init_scope():
            self.out = L.Linear(n_units, n_vocab)

    def forward(self, *ys):
        return word_loss(self, self.out(super().forward(*ys)), ys)

    def translate(self, n_sentences, max_length):
        """Greedy translations of the ``n_sentences`` the encoder sends: id arrays."""
        xp = self.xp
        with chainer.no_backprop_mode(), chainer.using_config("train", False):
            words = xp.full((n_sentences, 1), EOS, np.int32)
            # The first step receives the encoder's states; later steps carry their own.
            h, c, os, _ = self.rnn(sequence_embed(self.embed, list(words)))
            outputs = []
            for step in range(max_length):
                if step:
                    h, c, os = self.rnn.actual_rnn(h, c, sequence_embed(self.embed,
                                                                        list(words)))
                words = self.out(F.concat(os, axis=0)).array.argmax(axis=1).astype(np.int32)
                outputs.append(words)
                words = words[:, None]
                if bool((xp.stack(outputs) == EOS).any(axis=0).all()):
                    break
        return chainer.backends.cuda.to_cpu(xp.stack(outputs, axis=1))


def sequence_embed(embed, xs):
    """Embeds every sequence of ``xs`` with one call: a list of (length, units) variables."""
    lengths = [len(x) for x in xs]
    sections = np.cumsum(lengths[:-1])
    exs = embed(F.concat(xs, axis=0))
    return F.split_axis(exs, sections, 0)


def word_loss(link, scores, ys):
    """Cross-entropy of ``scores`` against each of ``ys`` then ``<eos>``; ``link`` reports it."""
    xp = link.xp
    eos = xp.array([EOS], np.int32)
    targets = xp.concatenate([xp.concatenate([y, eos]) for y in ys])
    loss = F.softmax_cross_entropy(scores, targets)
    chainer.report({"loss": loss, "perplexity": F.exp(loss)}, link)
    return loss


def build(comm, n_source_vocab, n_target_vocab, n_layers, n_units, dropout):
    """The encoder on rank 0, the decoder on rank 1."""
    if comm.rank == 0:
        return Encoder(comm, n_source_vocab, n_layers, n_units, dropout)
    return Decoder(comm, n_target_vocab, n_layers, n_units, dropout)
