"""ChainerMN's checkpointer, on mnpar's per-rank snapshots.

The checkpointer is a second way to write per-rank snapshots and resume,
older than :func:`multi_node_snapshot` and kept for code that uses it. It
does not bring a second snapshot format: every file is an mnpar snapshot
named with the run's ``name`` as prefix, written atomically by the same
code as :func:`mnpar.extensions.snapshot`, and the iteration it resumes
from is the one :func:`mnpar.extensions.resume` would pick, the newest
that every rank wrote completely::

    save(trainer, 120)  ->  <path>/<name>_iter_120.rank<rank>.npz  (atomic)
    maybe_load(trainer) ->  newest iteration complete on every rank, loaded on each

Old checkpoints are collected every ``gc_interval`` saves beyond the
``cp_interval`` it keeps; collecting is collective, and keeps the newest
``cp_interval`` iterations common to all ranks. ``finalize`` (the end of
``trainer.run``) removes the checkpoints, but only when training ended
without an error; ChainerMN removes them after an error too.
"""
import numbers
import os
import time
from typing import Any, List, Optional

import chainer
from chainer import serializers
from chainer.training import extension

from ..communicators._facade import Communicator, require_communicator
from . import _files as files
from ._resume import common_iterations, loadable, survey
from ._snapshot import write_atomically


class _Stats:
    """Wall-clock durations of the saves, for :meth:`MultiNodeCheckpointer.get_stats`."""

    def __init__(self) -> None:
        self.durations: List[float] = []

    def report(self) -> str:
        if not self.durations:
            return "No stats available"
        d = self.durations
        return (f"Snapshot duration stats (sec): avg={sum(d) / len(d):f}, min={min(d):f}, "
                f"max={max(d):f}")


class MultiNodeCheckpointer(extension.Extension):
    """Create it with :func:`create_multi_node_checkpointer`; see there.

    Its ``name`` (the run's) is also its name in the trainer, as in ChainerMN.
    """

    name: Any = None

    def __init__(self, name: str, comm: Communicator, cp_interval: int = 5, gc_interval: int = 5,
                 path: Optional[str] = None) -> None:
        require_communicator(comm, "create_multi_node_checkpointer")
        if not isinstance(name, str):
            raise TypeError(f"name={name!r} must be a string naming the run")
        files.check_prefix(name)
        for arg, value in (("cp_interval", cp_interval), ("gc_interval", gc_interval)):
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise TypeError(f"{arg}={value!r} must be an int")
            if value < 1:
                raise ValueError(f"{arg}={value} must be at least 1")
        self.name = name
        self.comm = comm
        self.cp_interval = int(cp_interval)
        self.gc_interval = int(gc_interval)
        self.path: Optional[str] = path
        if path is not None:
            os.makedirs(path, exist_ok=True)
        self.files: List[str] = []
        self.stats = _Stats()
        self._failed = False

    def __call__(self, trainer: Any) -> None:
        if self.path is None:
            self.path = trainer.out
        self.save(trainer, trainer.updater.iteration)

    def save(self, target: Any, iteration: int) -> None:
        """Writes this rank's checkpoint of ``target`` at ``iteration``, atomically.

        Every rank must call it at the same iterations: every
        ``gc_interval``-th call beyond ``cp_interval`` is collective.

        Args:
            target: what to serialize, mostly the trainer.
            iteration: the iteration the checkpoint is named after.
        """
        if self.path is None:
            raise ValueError("the checkpointer has no path: give path= when creating it, or "
                             "call maybe_load first, when it is used without a trainer")
        directory = self.path
        os.makedirs(directory, exist_ok=True)
        name = self._filename(iteration)
        start = time.time()
        write_atomically(os.path.join(directory, name), target,
                         files.temporary_prefix(iteration, self.comm.rank, self.name),
                         files.layout_of(target, self.comm.size, self.comm.rank))
        self.stats.durations.append(time.time() - start)
        if name not in self.files:
            self.files.append(name)
        if len(self.files) - self.cp_interval > self.gc_interval:
            self._collect(directory, int(iteration))

    def _collect(self, directory: str, iteration: int) -> None:
        """Keeps the newest ``cp_interval`` iterations all ranks hold; collective."""
        keep = [i for i in common_iterations(self.comm, directory, self.name)
                if i <= iteration][-self.cp_interval:]
        for i in files.complete_iterations(directory, self.comm.rank, self.name):
            if i not in keep:
                _remove(os.path.join(directory, self._filename(i)))
        self.files = [self._filename(i) for i in keep]

    def maybe_load(self, trainer: Any, optimizer: Any = None,
                   path: Optional[str] = None) -> Optional[int]:
        """Loads the newest checkpoint that every rank holds, if any; collective.

        Call it on every rank after adding the trainer's extensions, before
        ``trainer.run()``. If no iteration is complete on every rank, nothing
        is loaded and the trainer stays at iteration 0.

        Args:
            trainer: this rank's trainer (or any object ``save`` wrote).
            optimizer: accepted as in ChainerMN; unused. (ChainerMN uses it
                to skip the multi-node optimizer's first broadcast; mnpar's
                first broadcast after a complete resume changes nothing and
                skips no update.)
            path: where the checkpoints are, if the checkpointer was created
                without one; default ``trainer.out``.

        Returns:
            int or None: the iteration loaded, the same on every rank; None
            if none.

        Raises:
            RuntimeError: a loaded trainer holds another iteration than its
                file's name says.
            ValueError: on every rank, before anything is loaded, the newest
                checkpoint was written by another number of ranks or under
                another split (as :func:`mnpar.extensions.resume`).
        """
        if self.path is None:
            self.path = path if path is not None else trainer.out
        directory = str(self.path)
        common = loadable("maybe_load", directory, self.name,
                          survey(self.comm, directory, self.name, trainer))
        self.files = [self._filename(i) for i in common[-self.cp_interval:]]
        if not common:
            return None
        iteration = common[-1]
        file = os.path.join(directory, self._filename(iteration))
        serializers.load_npz(file, trainer)
        if isinstance(trainer, chainer.training.Trainer):
            loaded = int(trainer.updater.iteration)
            if loaded != iteration:
                raise RuntimeError(f"rank {self.comm.rank}: {file!r} holds a trainer at "
                                   f"iteration {loaded}, not {iteration} as its name says")
        return iteration

    def on_error(self, trainer: Any, exc: BaseException, tb: Any) -> None:
        """Marks the run failed, so that ``finalize`` keeps the checkpoints."""
        self._failed = True

    def finalize(self) -> None:
        """Removes this rank's checkpoints, unless training ended with an error."""
        if self._failed or self.path is None:
            return
        for name in self.files:
            _remove(os.path.join(self.path, name))
        self.files = []

    def get_stats(self) -> str:
        """The average, shortest and longest time a save took, as one line."""
        return self.stats.report()

    def _filename(self, iteration: int) -> str:
        return files.snapshot_filename(iteration, self.comm.rank, self.name)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def create_multi_node_checkpointer(name: str, comm: Communicator, cp_interval: int = 5,
                                   gc_interval: int = 5,
                                   path: Optional[str] = None) -> MultiNodeCheckpointer:
    """A trainer extension that checkpoints every rank and resumes them together.

    Each rank writes ``<name>_iter_<iteration>.rank<rank>.npz`` atomically
    (ChainerMN names them ``<name>.<rank>.<iteration>``). ``maybe_load``
    resumes every rank from the newest iteration that all ranks wrote
    completely, the one :func:`mnpar.extensions.resume` with
    ``prefix=name`` picks too. The checkpointer keeps at least the newest
    ``cp_interval`` common checkpoints, collects older ones every
    ``gc_interval`` saves, and removes them all when training finishes
    without an error.

    ChainerMN deprecates the checkpointer in favour of
    :func:`multi_node_snapshot`; mnpar keeps it without the warning.

    Args:
        name: the run's name, the files' prefix (no directory in it).
        comm: the mnpar communicator.
        cp_interval: how many checkpoints to keep at least.
        gc_interval: collect old checkpoints after this many more saves.
        path: the directory; default the trainer's ``out``.

    Returns:
        The extension; pass it to ``trainer.extend`` on every rank with the
        same trigger.

    Raises:
        TypeError: ``comm`` is not an mnpar communicator, an interval not an int.
        ValueError: an interval below 1, or a ``name`` with a directory in it.

    Example::

        checkpointer = mnpar.extensions.create_multi_node_checkpointer("run1", comm)
        trainer.extend(checkpointer, trigger=(100, "iteration"))
        checkpointer.maybe_load(trainer, optimizer)
        trainer.run()
    """
    return MultiNodeCheckpointer(name, comm, cp_interval, gc_interval, path)
