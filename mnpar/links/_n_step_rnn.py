"""MultiNodeNStepRNN: a stacked RNN whose states come from and go to other ranks.

The seq2seq hand-off: the encoder's final hidden (and, for LSTMs, cell)
states become the decoder's initial states on another rank::

    rank 0 (encoder)                         rank 1 (decoder)
    xs -> RNN -> (hy[, cy]) --send--> (hx[, cx]) -> RNN -> ys
                  delegate <--grads--   recv

All states travel as one tuple message, so their gradients come back as one
message too and can never be confused with each other.
"""
from typing import Any, Optional

import chainer
from chainer.links.rnn.n_step_rnn import NStepRNNBase

from ..communicators._facade import Communicator
from ..functions._point_to_point import recv_chained, send_chained
from . import _wiring_exchange as exchange_mod


class MultiNodeNStepRNN(chainer.Chain):
    """Runs ``actual_rnn`` with initial states received from ``rank_in``.

    Calling it with the RNN's sequence inputs returns the RNN's outputs plus
    one more element, the delegate variable of the send to ``rank_out`` (None
    where ``rank_out`` is None): e.g. ``hy, cy, ys, delegate`` for an LSTM.

    Args:
        actual_link: an ``NStepLSTM``, ``NStepGRU``, ``NStepRNNTanh``,
            ``NStepRNNReLU`` or one of their ``Bi`` variants.
        communicator: an mnpar communicator.
        rank_in: the rank that sends the initial states, or None (zeros).
        rank_out: the rank to send the final states to, or None.

    Example::

        encoder = MultiNodeNStepRNN(L.NStepLSTM(1, 8, 8, 0.0), comm, None, 1)
        hy, cy, ys, delegate = encoder(xs)
    """

    _mnpar_communicates = True
    mnpar_piece = True  # one layer of an RNN whose other layers are on other ranks

    def __init__(self, actual_link: Any, communicator: Communicator, rank_in: Optional[int] = None,
                 rank_out: Optional[int] = None) -> None:
        if not isinstance(actual_link, NStepRNNBase):
            raise ValueError(f"actual_link must be a chainer NStep RNN link (NStepLSTM, "
                             f"NStepGRU, NStepRNNTanh, NStepRNNReLU or a Bi variant), not "
                             f"{type(actual_link).__name__}")
        super().__init__()
        with self.init_scope():
            self.actual_rnn = actual_link
        self.communicator = communicator
        self.rank_in = None if rank_in is None else communicator.check_peer(rank_in, "rank_in")
        self.rank_out = (None if rank_out is None
                         else communicator.check_peer(rank_out, "rank_out"))
        self.n_cells = actual_link.n_cells
        exchange_mod.register_model(communicator, self)

    def forward(self, *inputs: Any) -> tuple:
        states: tuple = (None,) * self.n_cells
        if self.rank_in is not None:
            states, _ = recv_chained(self.communicator, self.rank_in)
            if len(states) != self.n_cells:
                raise ValueError(f"received {len(states)} state(s) from rank {self.rank_in}, "
                                 f"but {type(self.actual_rnn).__name__} needs {self.n_cells}")
        outputs = self.actual_rnn(*(tuple(states) + inputs))
        delegate = None
        if self.rank_out is not None:
            delegate = send_chained(tuple(outputs[:self.n_cells]), self.communicator,
                                    self.rank_out)
        return tuple(outputs) + (delegate,)


def create_multi_node_n_step_rnn(actual_link: Any, communicator: Communicator,
                                 rank_in: Optional[int] = None,
                                 rank_out: Optional[int] = None) -> MultiNodeNStepRNN:
    """Wraps a chainer stacked RNN link so its states travel between ranks.

    Args:
        actual_link: an NStep RNN link (``NStepLSTM``, ``NStepGRU``,
            ``NStepRNNTanh``, ``NStepRNNReLU`` or a ``Bi`` variant).
        communicator: an mnpar communicator.
        rank_in: the rank sending the initial states, or None.
        rank_out: the rank receiving the final states, or None.

    Returns:
        MultiNodeNStepRNN: call it like the RNN without the states; it returns
        the RNN's outputs and a delegate variable.

    Raises:
        ValueError: ``actual_link`` is not an NStep RNN link, or a rank is out
            of range or this rank.

    Example::

        rnn = mnpar.links.create_multi_node_n_step_rnn(
            L.NStepLSTM(n_layers, n_units, n_units, 0.1), comm, rank_in=None, rank_out=1)
    """
    return MultiNodeNStepRNN(actual_link, communicator, rank_in, rank_out)
