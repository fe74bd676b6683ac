"""Checkpoints of the one format for every layout, as a trainer extension.

``checkpoint(comm)`` writes ``<out>/checkpoint_iter_<iteration>`` with
:func:`mnpar.checkpoint.save` (every rank its shards, at once; the directory
appears whole or not at all) and keeps the newest few;
``resume_checkpoint(comm, trainer)`` loads the newest one into a trainer of
any layout and rank count (:func:`mnpar.checkpoint.load`)::

    run at 2 ranks, stage 2    checkpoint_iter_100/ index.json shard-00000-of-00002.bin ...
    resumed at 3 ranks, plain  resume_checkpoint(comm, trainer) -> 100, same data order
                               where the iterators' state is every rank's alike

The per-rank snapshots of :func:`mnpar.extensions.snapshot` stay what they
are: one chainer npz per rank, loadable by the same rank count and split
only (refused otherwise). This format is the one that moves across layouts.
"""
import numbers
import os
import shutil
from typing import Any, Optional, Sequence

from chainer.training import extension

from .. import checkpoint as ckpt
from ..checkpoint._tool import ITERATION
from ..checkpoint._write import is_temporary
from ..communicators._facade import Communicator, require_communicator
from ._files import check_prefix


def checkpoint_name(iteration: int, prefix: str = "checkpoint") -> str:
    """``<prefix>_iter_<iteration>``: the directory of a checkpoint."""
    return f"{check_prefix(prefix)}_iter_{int(iteration)}"


class ShardedCheckpoint(extension.Extension):
    """Writes the trainer as a checkpoint of the one format; see :func:`checkpoint`."""

    priority = -100  # after the reporters and evaluators, as chainer's snapshot

    def __init__(self, comm: Communicator, n_retains: Optional[int] = 3,
                 prefix: str = "checkpoint", directory: Optional[str] = None,
                 trigger: Any = (1, "epoch"), names: Any = None) -> None:
        require_communicator(comm, "checkpoint")
        if n_retains is not None and (not isinstance(n_retains, numbers.Integral)
                                      or isinstance(n_retains, bool) or n_retains < 1):
            raise ValueError(f"n_retains={n_retains!r} must be an int >= 1 (or None to keep "
                             "all): a checkpoint is whole or absent, so one is enough")
        self.comm = comm
        self.n_retains = n_retains
        self.prefix = check_prefix(prefix)
        self.directory = directory
        self.trigger = trigger
        self.names = names

    def _directory(self, trainer: Any) -> str:
        return trainer.out if self.directory is None else self.directory

    def initialize(self, trainer: Any) -> None:
        """Rank 0 removes temporary directories an earlier run left (a crash mid-write)."""
        root = self._directory(trainer)
        if self.comm.rank != 0 or not os.path.isdir(root):
            return
        for name in os.listdir(root):
            if is_temporary(name) and name[1:].startswith(self.prefix + "_iter_"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)

    def __call__(self, trainer: Any) -> None:
        root = self._directory(trainer)
        if self.comm.rank == 0:
            os.makedirs(root, exist_ok=True)
        iteration = int(trainer.updater.iteration)
        path = os.path.join(root, checkpoint_name(iteration, self.prefix))
        self.comm.bcast_obj(None)  # the directory exists before any rank writes into it
        ckpt.save(path, self.comm, trainer, names=self.names)
        if self.comm.rank == 0:
            self._prune(root, iteration)

    def _prune(self, root: str, iteration: int) -> None:
        """Keeps the newest ``n_retains`` up to ``iteration``; drops newer ones (from a run
        this one resumed before)."""
        found = []
        for name in os.listdir(root):
            match = ITERATION.fullmatch(name)
            if match and match["prefix"] == self.prefix:
                found.append(int(match["iteration"]))
        kept = sorted(i for i in found if i <= iteration)
        stale = [i for i in found if i > iteration]
        if self.n_retains is not None:
            stale += kept[:-self.n_retains]
        for i in stale:
            shutil.rmtree(os.path.join(root, checkpoint_name(i, self.prefix)),
                          ignore_errors=True)


def checkpoint(comm: Communicator, n_retains: Optional[int] = 3, prefix: str = "checkpoint",
               directory: Optional[str] = None, trigger: Any = (1, "epoch"),
               names: Any = None) -> ShardedCheckpoint:
    """A trainer extension that writes checkpoints any layout loads.

    Each time it is triggered every rank writes its shards of the model, the
    optimizer state and the trainer's and iterators' state into
    ``<directory>/<prefix>_iter_<iteration>`` (:func:`mnpar.checkpoint.save`), and
    rank 0 keeps the newest ``n_retains``. Add it on every rank with the same
    trigger; collective.

    Args:
        comm: the communicator of every rank of the job.
        n_retains: checkpoints to keep (at least 1), or None for all.
        prefix: the directories' name prefix.
        directory: where to write (a directory every rank sees); default ``trainer.out``.
        trigger: when to write, e.g. ``(100, 'iteration')``.
        names: where this rank's links are in the whole model
            (:func:`mnpar.checkpoint.save`).

    Returns:
        ShardedCheckpoint: the extension.

    Raises:
        TypeError: ``comm`` is not an mnpar communicator.
        ValueError: ``n_retains`` below 1, or a ``prefix`` with a directory in it.

    Example::

        trainer.extend(mnpar.extensions.checkpoint(comm, trigger=(100, "iteration")))
        mnpar.extensions.resume_checkpoint(comm, trainer)    # before trainer.run()
        trainer.run()
    """
    return ShardedCheckpoint(comm, n_retains, prefix, directory, trigger, names)


def resume_checkpoint(comm: Communicator, trainer: Any, path: Optional[str] = None,
                      prefix: str = "checkpoint", names: Any = None,
                      exclude: Sequence[str] = ()) -> Optional[int]:
    """Loads the newest checkpoint (or ``path``) into ``trainer``; collective.

    Any layout and rank count may have written it. Call it after building the
    trainer and adding its extensions, before ``trainer.run()``.

    Args:
        comm: the communicator of every rank of the job.
        trainer: this rank's trainer.
        path: a checkpoint directory, or a directory of them (default
            ``trainer.out``), of which the newest ``<prefix>_iter_<n>`` loads.
        prefix: the checkpoints' name prefix.
        names: where this rank's links are in the whole model.
        exclude: names not to load (``fnmatch`` patterns), e.g. an iterator over
            each rank's own shard of the data when the rank count changed.

    Returns:
        int or None: the iteration loaded (the same on every rank), or None where
        there is no checkpoint (a fresh start).

    Raises:
        CheckpointError: on every rank: see :func:`mnpar.checkpoint.load`.
    """
    require_communicator(comm, "resume_checkpoint")
    where = trainer.out if path is None else path
    chosen = None
    if comm.rank == 0:
        chosen = (where if os.path.isfile(os.path.join(where, "index.json"))
                  else ckpt.latest(where, check_prefix(prefix)))
    chosen = comm.bcast_obj(chosen)
    if chosen is None:
        if path is not None:
            raise ckpt.CheckpointError(f"resume_checkpoint: {path!r} holds no checkpoint "
                                       f"(no index.json, no {prefix}_iter_<n>)")
        return None
    index = ckpt.load(chosen, comm, trainer, names=names, exclude=exclude)
    return index.iteration
