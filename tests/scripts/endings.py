"""Jobs in which ranks finish, each a case of test_communicators_ending and its cluster twin.

::

    mpiexec -n N python tests/scripts/endings.py CASE

A rank that ends on purpose first writes ``rank R finishes at T`` (T on the
monotonic clock) to stderr, so the tests can time how soon the job ends
after it. Every case runs with the default timeout (600 s).
"""
import sys
import time

import numpy as np

import mnpar

comm = mnpar.create_communicator("naive")


def finish() -> None:
    sys.stderr.write(f"rank {comm.rank} finishes at {time.monotonic():.3f}\n")
    sys.stderr.flush()


def missing_send():
    """Rank 0 ends without the message the others wait for."""
    if comm.rank == 0:
        finish()
    else:
        comm.recv(0, tag=4)


def large_unreceived():
    """Rank 0 sends 64 MiB to each other rank, which end without receiving it."""
    if comm.rank == 0:
        for peer in range(1, comm.size):
            comm.send(np.zeros(16 << 20, np.float32), peer)
    else:
        finish()


def repeat_unreceived():
    """Rank 0 sends rank 1 the same 1 MiB array twice (the second time its payload
    alone, ``_repeats``); rank 1 receives the first and ends."""
    data = np.ones(1 << 18, np.float32)
    if comm.rank == 0:
        comm.send(data, 1)
        comm.send(data, 1)
    elif comm.rank == 1:
        np.testing.assert_array_equal(comm.recv(0, 0), data)
        finish()


def skipped_collective():
    """The last rank ends without joining the others' allreduce."""
    if comm.rank == comm.size - 1:
        finish()
    else:
        comm.allreduce(np.ones(3))


def unequal_iterations():
    """ChainerMN's MLP loop trained for 6 iterations on rank 0 and for 4 on rank 1."""
    import chainer
    import chainer.links as L

    np.random.seed(0)
    x = np.random.randn(64, 4).astype(np.float32)
    t = np.random.randint(0, 3, 64).astype(np.int32)
    model = mnpar.MultiNodeChainList(comm)
    if comm.rank == 0:
        model.add_link(L.Linear(4, 5), rank_in=None, rank_out=1)
        model.add_link(L.Linear(3, 3), rank_in=1, rank_out=None)
        target, data, stop = L.Classifier(model), chainer.datasets.TupleDataset(x, t), 6
    else:
        model.add_link(L.Linear(5, 3), rank_in=0, rank_out=0)
        target, stop = model, 4  # the mistake: fewer iterations on this rank
        data = mnpar.datasets.create_empty_dataset(chainer.datasets.TupleDataset(x, t))
    optimizer = chainer.optimizers.SGD().setup(target)
    updater = chainer.training.StandardUpdater(
        chainer.iterators.SerialIterator(data, 8), optimizer)
    chainer.training.Trainer(updater, (stop, "iteration")).run()
    if comm.rank == 1:
        finish()


def never_forwards():
    """Rank 1 builds its part of the MLP loop and ends without running it."""
    import chainer.links as L

    model = mnpar.MultiNodeChainList(comm)
    if comm.rank == 0:
        model.add_link(L.Linear(4, 5), rank_in=None, rank_out=1)
        model.add_link(L.Linear(3, 3), rank_in=1, rank_out=None)
        model(np.ones((2, 4), np.float32))  # its first forward: the wiring check's wait
    else:
        model.add_link(L.Linear(5, 3), rank_in=0, rank_out=0)
        finish()


def finalized():
    """Rank 0 calls finalize() while rank 1 waits for its message."""
    if comm.rank == 0:
        finish()
        comm.finalize()  # then waits for the others to finalize too
    else:
        comm.recv(0)


def failed():
    """Rank 0 fails (run with MNPAR_ABORT_ON_ERROR=0: nothing aborts the job)."""
    if comm.rank == 0:
        finish()
        raise ValueError("bad input on purpose")
    comm.recv(0)


def others_go_on():
    """Rank 2 ends at once; ranks 0 and 1 go on talking for 3 s: nothing may stop them."""
    if comm.rank != 2:
        other = 1 - comm.rank
        for i in range(30):
            comm.send(np.full(3, i), other)
            assert comm.recv(other)[0] == i
            time.sleep(0.1)
    sys.stdout.write(f"rank {comm.rank} done\n")  # one write: lines of ranks may mix


def unread():
    """Rank 0 sends three messages that rank 1 never receives."""
    if comm.rank == 0:
        comm.send(np.zeros(10, np.float32), 1, tag=3)
        comm.send_obj({"a": 1}, 1, tag=4)
        comm.send((np.zeros(3), np.ones((2, 2), np.int32)), 1, tag=5)
    sys.stdout.write(f"rank {comm.rank} done\n")  # one write: lines of ranks may mix


def unread_chain_list():
    """Rank 0's MultiNodeChainList sends to rank 1, whose program never receives it."""
    import chainer.links as L

    if comm.rank == 0:
        model = mnpar.MultiNodeChainList(comm)
        model.add_link(L.Linear(3, 2), rank_in=None, rank_out=1)
        model(np.zeros((1, 3), np.float32))
    sys.stdout.write(f"rank {comm.rank} done\n")


def several_models():
    """Three MultiNodeChainLists, each on two of the three ranks: a correct program.

    Each model's wiring announcements reach the rank outside it, which never
    reads them; they are received at the end, silently.
    """
    import chainer.links as L

    np.random.seed(0)
    for first, second in [(0, 1), (1, 2), (0, 2)]:
        model = mnpar.MultiNodeChainList(comm)
        if comm.rank == first:
            model.add_link(L.Linear(3, 3), rank_in=None, rank_out=second)
            model(np.ones((2, 3), np.float32))
        elif comm.rank == second:
            model.add_link(L.Linear(3, 3), rank_in=first, rank_out=None)
            model()
    sys.stdout.write(f"rank {comm.rank} done\n")  # one write: lines of ranks may mix


CASES = {f.__name__: f for f in (missing_send, large_unreceived, skipped_collective,
                                 unequal_iterations, never_forwards, finalized, failed,
                                 others_go_on, unread, unread_chain_list, several_models,
                                 repeat_unreceived)}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
