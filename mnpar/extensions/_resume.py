"""Resuming every rank from the same iteration.

The ranks of a job that died may hold different snapshots: one was killed
while writing, one had already deleted an old one. Each rank lists the
iterations it wrote completely, the lists are gathered on every rank, and
the newest iteration in all of them is the one every rank loads::

    rank 0:  40  60  80            ->  common {40, 60}  ->  every rank loads 60
    rank 1:  40  60     (80 was being written)
"""
import os
from typing import Any, List, Optional

from chainer import serializers

from . import _files as files


def find_common_snapshot(comm: Any, directory: str, prefix: str = "snapshot") -> Optional[int]:
    """The newest iteration that every rank snapshotted completely; collective.

    Args:
        comm: the mnpar communicator; every rank must call this.
        directory: where the snapshots are (each rank reads its own files).
        prefix: the snapshots' name prefix.

    Returns:
        int or None: the same iteration on every rank, or None on every rank
        if no iteration is complete everywhere (or there are no snapshots).
    """
    everyone = _gather_iterations(comm, directory, prefix)
    common = set(everyone[0]).intersection(*everyone[1:])
    return max(common) if common else None


def _gather_iterations(comm: Any, directory: str, prefix: str) -> List[List[int]]:
    return comm.allgather_obj(files.complete_iterations(directory, comm.rank, prefix))


def resume(comm: Any, trainer: Any, directory: Optional[str] = None,
           prefix: str = "snapshot", iteration: Optional[int] = None) -> Optional[int]:
    """Loads every rank's trainer from the same snapshot; collective.

    Call it after building the trainer and adding its extensions, before
    ``trainer.run()``.

    Args:
        comm: the mnpar communicator; every rank must call this.
        trainer: this rank's ``chainer.training.Trainer``.
        directory: where the snapshots are; default ``trainer.out``.
        prefix: the snapshots' name prefix.
        iteration: the iteration to load; default the newest that every
            rank wrote completely.

    Returns:
        int or None: the iteration loaded (the same on every rank), or None
        when no snapshot is complete on every rank (nothing is loaded; the
        run starts afresh).

    Raises:
        ValueError: on every rank, if ``iteration`` was given and some rank
            has no complete snapshot of it.
        RuntimeError: a loaded snapshot holds another iteration than its name says.

    Example::

        trainer.extend(mnpar.extensions.snapshot(comm, trigger=(100, "iteration")))
        start = mnpar.extensions.resume(comm, trainer)
        if comm.rank == 0 and start is not None:
            print(f"resumed from iteration {start}")
        trainer.run()
    """
    directory = trainer.out if directory is None else directory
    if iteration is None:
        iteration = find_common_snapshot(comm, directory, prefix)
        if iteration is None:
            return None
    else:
        everyone = _gather_iterations(comm, directory, prefix)
        missing = [r for r, its in enumerate(everyone) if int(iteration) not in its]
        if missing:
            raise ValueError(
                f"iteration={iteration}: rank(s) {missing} have no complete "
                f"{files.snapshot_filename(iteration, missing[0], prefix)!r} in "
                f"{directory!r}; complete iterations per rank: {everyone}")
    path = os.path.join(directory, files.snapshot_filename(iteration, comm.rank, prefix))
    serializers.load_npz(path, trainer)
    loaded = int(trainer.updater.iteration)
    if loaded != int(iteration):
        raise RuntimeError(f"rank {comm.rank}: {path!r} holds a trainer at iteration "
                           f"{loaded}, not {iteration} as its name says")
    return int(iteration)
