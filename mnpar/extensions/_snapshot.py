"""A trainer snapshot per rank, written atomically, the newest few kept.

In model parallelism every rank holds a different part of the model, so every
rank saves its own trainer (model part, optimizer, iterator, extensions). A
rank can die at any moment, also halfway through a write; the write therefore
goes to a temporary file in the same directory, is flushed to the disk, and
only then renamed to its final name (``os.replace`` is atomic on POSIX)::

    save_npz -> .snapshot_iter_120.rank1.npz.k3j9.tmp -> fsync -> rename
                                                               -> snapshot_iter_120.rank1.npz

:func:`mnpar.extensions.resume` then picks the newest iteration whose file
is there for every rank. Each file also records what wrote it (the rank
count, the rank and how its models are split: ``_files.WRITTEN_BY``), so
that ``resume`` refuses a snapshot that another rank count or split wrote.
"""
import numbers
import os
import secrets
from typing import Any, Optional

from chainer.training import extension

from ..checkpoint._write import fsync_directory
from ..communicators._facade import Communicator
from . import _files as files


class RankSnapshot(extension.Extension):
    """Writes this rank's trainer to ``<prefix>_iter_<iteration>.rank<rank>.npz``.

    Create it with :func:`mnpar.extensions.snapshot`; see there.
    """

    priority = -100  # after the reporters and evaluators, as chainer's snapshot

    def __init__(self, comm: Communicator, n_retains: Optional[int] = 3, prefix: str = "snapshot",
                 directory: Optional[str] = None, trigger: Any = (1, "epoch")) -> None:
        rank = getattr(comm, "rank", None)
        if not isinstance(rank, numbers.Integral):
            raise TypeError(f"comm must be a communicator with an int rank, not "
                            f"{type(comm).__name__} {comm!r}")
        if n_retains is not None and (not isinstance(n_retains, numbers.Integral)
                                      or isinstance(n_retains, bool) or n_retains < 2):
            raise ValueError(
                f"n_retains={n_retains!r} must be an int >= 2 (or None to keep all): a rank "
                "can die while writing the newest snapshot, and the one before must then "
                "still be there on every rank")
        self.rank = int(rank)
        size = getattr(comm, "size", None)
        self.size = int(size) if isinstance(size, numbers.Integral) else None
        self.n_retains = n_retains
        self.prefix = files.check_prefix(prefix)
        self.directory = directory
        self.trigger = trigger

    def _directory(self, trainer: Any) -> str:
        return trainer.out if self.directory is None else self.directory

    def initialize(self, trainer: Any) -> None:
        """Removes temporary files that an earlier run of this rank left behind."""
        directory = self._directory(trainer)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            if files.is_temporary(name, self.rank, self.prefix):
                _remove(os.path.join(directory, name))

    def __call__(self, trainer: Any) -> None:
        directory = self._directory(trainer)
        os.makedirs(directory, exist_ok=True)
        iteration = int(trainer.updater.iteration)
        final = os.path.join(directory, files.snapshot_filename(iteration, self.rank,
                                                                self.prefix))
        layout = (None if self.size is None else
                  files.layout_of(trainer, self.size, self.rank))
        write_atomically(final, trainer,
                         files.temporary_prefix(iteration, self.rank, self.prefix), layout)
        self._prune(directory, iteration)

    def _prune(self, directory: str, iteration: int) -> None:
        """Keeps the newest ``n_retains``; drops files from beyond ``iteration``.

        A snapshot newer than the one just written comes from a run that was
        abandoned (this run resumed from an earlier one); left in place it
        could be mistaken for part of this run's history.
        """
        kept = files.complete_iterations(directory, self.rank, self.prefix)
        stale = [i for i in kept if i > iteration]
        kept = [i for i in kept if i <= iteration]
        if self.n_retains is not None:
            stale += kept[:-self.n_retains]
        for i in stale:
            _remove(os.path.join(directory, files.snapshot_filename(i, self.rank, self.prefix)))


def write_atomically(path: str, target: Any, temporary_prefix: str,
                     layout: Optional[files.Layout] = None) -> None:
    """Saves ``target`` with ``save_npz`` so that ``path`` is whole or absent; ``layout``
    (what writes it: ``_files.layout_of``) goes in as the file's ``WRITTEN_BY``."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f"{temporary_prefix}{os.getpid()}_{secrets.token_hex(4)}.tmp")
    # Not mkstemp: its files are private (0600); a snapshot gets the umask's usual mode.
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        files.save_npz(tmp, target, layout)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    fsync_directory(directory)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def snapshot(comm: Communicator, n_retains: Optional[int] = 3, prefix: str = "snapshot",
             directory: Optional[str] = None,
             trigger: Any = (1, "epoch")) -> RankSnapshot:
    """A trainer extension that snapshots this rank's trainer atomically.

    Each rank writes ``<prefix>_iter_<iteration>.rank<rank>.npz`` (e.g.
    ``snapshot_iter_120.rank1.npz``) with chainer's ``save_npz``: first to a
    temporary file in the same directory, then ``fsync`` and ``os.replace``,
    so a rank killed while writing leaves the previous snapshots intact and
    no partial file under a snapshot name. After each write the rank keeps
    its newest ``n_retains`` snapshots and deletes older ones (and any newer
    ones, left by an abandoned run). Writing needs no communication.

    Add it on every rank with the same trigger, and resume with
    :func:`mnpar.extensions.resume`, which loads the newest iteration that
    every rank wrote completely. Each file records the rank count and how
    this rank's models are split; ``resume`` refuses, on every rank, a
    snapshot written by another rank count or split.

    Args:
        comm: the mnpar communicator (its ``rank`` names the file).
        n_retains: how many snapshots of this rank to keep (at least 2, so
            that one whole snapshot survives a crash during a write), or None
            to keep all.
        prefix: the file names' first part.
        directory: where to write; default the trainer's ``out``.
        trigger: when to write, as for any extension, e.g. ``(500, 'iteration')``.

    Returns:
        RankSnapshot: the extension; pass it to ``trainer.extend``.

    Raises:
        ValueError: ``n_retains`` below 2, or a ``prefix`` with a directory in it.
        TypeError: ``comm`` has no int ``rank``.

    Example::

        trainer.extend(mnpar.extensions.snapshot(comm, trigger=(100, "iteration")))
        mnpar.extensions.resume(comm, trainer)    # before trainer.run()
        trainer.run()
    """
    return RankSnapshot(comm, n_retains, prefix, directory, trigger)
