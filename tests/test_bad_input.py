"""Every public entry point, fed what a user gets wrong: a clear error, no hang.

Each row is called on every rank alike, so no rank waits for another; the
error must name the offending value. The last test covers the cross-rank
half of the contract: one rank's mistake ends the whole job quickly.
"""
import os
import subprocess
import sys
import textwrap
import time

import chainer
import chainer.links as L
import numpy as np
import pytest

import mnpar
import mnpar.functions as F
from mnpar.datasets import create_empty_dataset
from mnpar.extensions import snapshot
from mnpar.links import MultiNodeChainList, create_multi_node_n_step_rnn

pytestmark = pytest.mark.mpi(min_size=1)

X = np.ones((2, 3), np.float32)


def nxt(c):
    return (c.rank + 1) % c.size


def chain_list(c, *wiring):
    model = MultiNodeChainList(c)
    for rank_in, rank_out in wiring:
        model.add_link(L.Linear(3, 3), rank_in=rank_in, rank_out=rank_out)
    return model


def needs_peer(name, *row):
    """A row whose mistake is found after the peer check: needs a rank to send to."""
    return (name, *row, pytest.mark.mpi(min_size=2))


CASES = [
    # communicators
    ("unknown name", lambda c: mnpar.create_communicator("fast"), ValueError,
     "unknown communicator_name 'fast'"),
    ("misspelt option", lambda c: mnpar.create_communicator("naive", tiemout=3), TypeError,
     r"unknown keyword\(s\) \['tiemout'\]"),
    ("mpi_comm not a communicator", lambda c: mnpar.create_communicator("naive", mpi_comm=3),
     TypeError, "mpi_comm must be an mpi4py communicator, not int"),
    ("negative timeout", lambda c: mnpar.create_communicator("naive", timeout=-2), ValueError,
     "timeout=-2"),
    ("pure_nccl on CPU", lambda c: mnpar.create_communicator("pure_nccl"), RuntimeError,
     "needs cupy"),
    ("send: rank too big", lambda c: c.send(X, c.size + 2), ValueError,
     r"dest=\d+ is out of range for a communicator of size \d"),
    ("send: own rank", lambda c: c.send(X, c.rank), ValueError, "own rank"),
    needs_peer("send: negative tag", lambda c: c.send(X, nxt(c), tag=-3), ValueError, "tag=-3"),
    needs_peer("send: a string", lambda c: c.send("abc", nxt(c)), TypeError, "not str"),
    needs_peer("send: objects", lambda c: c.send(np.array([None]), nxt(c)), TypeError,
               "dtype object"),
    needs_peer("send: numbers in a list", lambda c: c.send([X, 2], nxt(c)), TypeError,
     r"data\[1\] must be an array, not int"),
    ("recv: float rank", lambda c: c.recv(0.5), TypeError, "source must be an int rank"),
    ("bcast: root out of range", lambda c: c.bcast(X, root=-1), ValueError, "root=-1"),
    ("gather: a tuple", lambda c: c.gather((X, X)), TypeError, "x must be one array"),
    ("alltoall: wrong count", lambda c: c.alltoall([X] * (c.size + 1)), ValueError,
     r"one array per rank \(\d\), got \d"),
    ("allreduce: bool", lambda c: c.allreduce(X > 0), TypeError, "bool array"),
    ("bcast_data: not a model", lambda c: c.bcast_data(X), TypeError,
     "bcast_data needs a chainer.Link .* not ndarray"),
    ("mean_grad: not a model", lambda c: c.multi_node_mean_grad("model"), TypeError,
     "multi_node_mean_grad needs a chainer.Link .* not str"),
    # differentiable functions
    ("F.send: rank too big", lambda c: F.send(X, c, rank=c.size), ValueError,
     "rank=.* out of range"),
    ("F.send: own rank", lambda c: F.send(X, c, rank=c.rank), ValueError, "own rank"),
    needs_peer("F.send: a string", lambda c: F.send("x", c, rank=nxt(c)), TypeError, "not str"),
    ("F.recv: float rank", lambda c: F.recv(c, rank=1.5), TypeError, "rank must be an int"),
    ("F.pseudo_connect: nothing", lambda c: F.pseudo_connect(None), ValueError,
     "at least one actual variable"),
    ("F.bcast: root out of range", lambda c: F.bcast(c, X, root=c.size), ValueError,
     r"root=\d+ is out of range"),
    ("F.allreduce: a list", lambda c: F.allreduce(c, [X]), TypeError, "not list"),
    # links
    ("add_link: not a link", lambda c: chain_list(c).add_link("mlp"), TypeError,
     "add_link needs a chainer.Link, not str"),
    ("add_link: rank_in out of range", lambda c: chain_list(c, (c.size + 1, None)),
     ValueError, r"rank_in=\d+.* out of range"),
    ("add_link: empty list", lambda c: chain_list(c, ([], None)), ValueError,
     r"rank_in=\[\] is empty"),
    ("add_link: float rank", lambda c: chain_list(c, (None, 1.0)), TypeError,
     r"got float 1.0 in rank_out=1.0"),
    ("add_link: two outputs", lambda c: chain_list(c, (None, None), (None, None)), ValueError,
     "already has rank_out=None"),
    ("n_step_rnn: not an RNN", lambda c: create_multi_node_n_step_rnn(L.Linear(2, 2), c),
     ValueError, "must be a chainer NStep RNN link .* not Linear"),
    # datasets and extensions
    ("empty dataset of a number", lambda c: create_empty_dataset(5), TypeError,
     "needs a dataset with a length, not int"),
    ("snapshot keeps one", lambda c: snapshot(c, n_retains=1), ValueError, "n_retains=1"),
    ("snapshot: not a communicator", lambda c: snapshot("comm"), TypeError,
     "comm must be a communicator"),
]


@pytest.mark.parametrize("call, error, match", [
    pytest.param(*c[1:4], id=c[0], marks=c[4:]) for c in CASES])
def test_bad_input_raises_a_clear_error(call, error, match):
    comm = mnpar.create_communicator("naive", timeout=20)
    try:
        with pytest.raises(error, match=match):
            with chainer.using_config("train", True):
                call(comm)
    finally:
        comm.finalize()


@pytest.mark.slow
def test_one_ranks_mistake_ends_the_job_quickly(tmp_path):
    # Rank 0 passes a bad rank; rank 1 waits for a message that never comes.
    script = tmp_path / "mistake.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import mnpar
        import mnpar.functions as F
        comm = mnpar.create_communicator("naive", timeout=300)
        if comm.rank == 0:
            F.send(np.ones(3, np.float32), comm, rank=7)
        else:
            F.recv(comm, rank=0)
    """))
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    start = time.monotonic()
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 20
    assert proc.returncode != 0
    assert "[rank 0] ValueError: rank=7 is out of range for a communicator of size 2" \
        in proc.stderr
