"""``examples/mlp/train_mlp.py`` with a fault the Slurm tests arm: the same arguments, the
same training, bit for bit, plus one extension after each iteration's snapshot.

While the file ``FAULT_MARKER`` exists, the fault is armed; from iteration
``FAULT_AT`` on, rank 0 says so once (``FAULT armed at iteration N``) and
every rank then sleeps ``FAULT_PACE`` seconds per iteration, so the job is
still training when the test acts on it (kills a rank, cancels the job, cuts
a host off, lets the time limit pass). ``FAULT=raise``: rank ``FAULT_RANK``
(default 1) removes the marker and raises at iteration ``FAULT_AT``. A
requeued job finds no marker and trains to the end at full speed, from the
snapshot that ``--resume auto`` picks.
"""
import os
import sys
import time

import chainer
from chainer.training import extension

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
MLP = os.path.join(ROOT, "examples", "mlp")
sys.path[1:1] = [MLP, os.path.dirname(MLP)]
# isort: split
import common  # noqa: E402  examples/common.py
import train_mlp  # noqa: E402


class InjectedFailure(RuntimeError):
    """The failure that ``FAULT=raise`` injects."""


class Fault(extension.Extension):
    """Paces (or fails) the run while the marker exists."""

    trigger = (1, "iteration")
    priority = -200  # after mnpar.extensions.snapshot (-100): that iteration is on disk

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.marker = os.environ.get("FAULT_MARKER", "")
        self.at = int(os.environ.get("FAULT_AT", "40"))
        self.pace = float(os.environ.get("FAULT_PACE", "0.05"))
        self.kind = os.environ.get("FAULT", "")
        self.victim = int(os.environ.get("FAULT_RANK", "1"))
        self.said = False

    def __call__(self, trainer: chainer.training.Trainer) -> None:
        iteration = trainer.updater.iteration
        if iteration < self.at or not self.marker or not os.path.exists(self.marker):
            return
        if self.kind == "raise" and self.rank == self.victim and iteration == self.at:
            os.remove(self.marker)
            print(f"FAULT raises at {time.time():.3f}", flush=True)
            raise InjectedFailure(f"rank {self.rank} fails at iteration {iteration}")
        if self.rank == 0 and not self.said:
            self.said = True
            print(f"FAULT armed at iteration {iteration} ({time.time():.3f})", flush=True)
        time.sleep(self.pace)


def add_snapshots(comm, trainer, args):
    adding(comm, trainer, args)
    trainer.extend(Fault(comm.rank))


adding = common.add_snapshots
common.add_snapshots = add_snapshots

if __name__ == "__main__":
    sys.exit(train_mlp.main())
