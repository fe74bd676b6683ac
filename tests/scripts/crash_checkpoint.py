"""Writes one checkpoint, then SIGKILLs the last rank halfway through writing the next.

    mpiexec -n N python crash_checkpoint.py ROOT

``ROOT/checkpoint_iter_1`` is whole; ``ROOT/checkpoint_iter_2`` never gets its name: the last rank
dies after half of its shard file is on disk, the others wait for it in the
save and end when the job ends.
"""
import os
import signal
import sys

import chainer
import chainer.links as L
import numpy as np

import mnpar
from mnpar.checkpoint import _write


def main(root: str) -> None:
    comm = mnpar.create_communicator("naive", timeout=60)
    np.random.seed(0)
    model = chainer.Sequential(L.Linear(3, 4), L.Linear(4, 2))
    opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), comm, stage=2)
    opt.setup(model)
    model.cleargrads()
    opt.update()
    mnpar.checkpoint.save(os.path.join(root, "checkpoint_iter_1"), comm, opt)
    if comm.rank == comm.size - 1:
        write = _write.write_rank_file

        def die_halfway(directory, rank, size, h):
            write(directory, rank, size, h)
            name = os.path.join(directory, _write.shard_file(rank, size))
            with open(name, "r+b") as f:
                f.truncate(os.path.getsize(name) // 2)
            os.kill(os.getpid(), signal.SIGKILL)
        _write.write_rank_file = die_halfway
    mnpar.checkpoint.save(os.path.join(root, "checkpoint_iter_2"), comm, opt)


if __name__ == "__main__":
    main(sys.argv[1])
