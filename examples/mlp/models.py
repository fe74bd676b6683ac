"""The tutorial's MLP split over two ranks, written two ways.

::

    rank 0: x -> l1 -> relu --send--> rank 1: l2 -> relu -> l3 --send--> rank 0: y
                                                                         loss(y, t)

``send-recv`` spells the communication out with ``send``/``recv`` and a
delegate variable; ``chain-list`` lets ``mnpar.MultiNodeChainList`` insert it.
Both create the same layers in the same order, so with the same seed they
start from the same weights and train identically.
"""
import chainer
import chainer.functions as F
import chainer.links as L

import mnpar

STYLES = ("send-recv", "chain-list")


# -- explicit send and recv ---------------------------------------------------

class MLP0(chainer.Chain):
    """Rank 0: the first layer; the class scores come back from rank 1."""

    def __init__(self, comm, n_in, n_units):
        super().__init__()
        self.comm = comm
        with self.init_scope():
            self.l1 = L.Linear(n_in, n_units)

    def forward(self, x):
        h0 = F.relu(self.l1(x))
        phi = mnpar.functions.send(h0, self.comm, rank=1)
        # The delegate makes backward continue from this recv into the send.
        return mnpar.functions.recv(self.comm, rank=1, delegate_variable=phi)


class MLP1(chainer.Chain):
    """Rank 1: the rest; receives from rank 0 and sends the scores back."""

    def __init__(self, comm, n_units, n_out):
        super().__init__()
        self.comm = comm
        with self.init_scope():
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, n_out)

    def forward(self, *_):  # the empty dataset calls the model with no arguments
        h0 = mnpar.functions.recv(self.comm, rank=0)
        h1 = F.relu(self.l2(h0))
        # Returned as the "loss": backward() on it receives the gradient from rank 0.
        return mnpar.functions.send(self.l3(h1), self.comm, rank=0)


# -- MultiNodeChainList --------------------------------------------------------

class MLP0SubA(chainer.Chain):
    def __init__(self, n_in, n_units):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(n_in, n_units)

    def forward(self, x):
        return F.relu(self.l1(x))


class MLP0SubB(chainer.Chain):
    def forward(self, y):
        return y  # the scores rank 1 sent back


class MLP0ChainList(mnpar.MultiNodeChainList):
    def __init__(self, comm, n_in, n_units):
        super().__init__(comm)
        self.add_link(MLP0SubA(n_in, n_units), rank_in=None, rank_out=1)
        self.add_link(MLP0SubB(), rank_in=1, rank_out=None)


class MLP1Sub(chainer.Chain):
    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, n_out)

    def forward(self, h0):
        return self.l3(F.relu(self.l2(h0)))


class MLP1ChainList(mnpar.MultiNodeChainList):
    def __init__(self, comm, n_units, n_out):
        super().__init__(comm)
        self.add_link(MLP1Sub(n_units, n_out), rank_in=0, rank_out=0)


def build(style, comm, n_in, n_units, n_out):
    """This rank's part: a ``Classifier`` on rank 0, the middle layers on rank 1."""
    if style not in STYLES:
        raise ValueError(f"model style {style!r} is not one of {STYLES}")
    if comm.rank == 0:
        first = MLP0 if style == "send-recv" else MLP0ChainList
        return L.Classifier(first(comm, n_in, n_units))
    rest = MLP1 if style == "send-recv" else MLP1ChainList
    return rest(comm, n_units, n_out)
