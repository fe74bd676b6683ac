"""Resuming every rank from the same iteration.

The ranks of a job that died may hold different snapshots: one was killed
while writing, one had already deleted an old one. Each rank lists the
iterations it wrote completely, the lists are gathered on every rank, and
the newest iteration in all of them is the one every rank loads::

    rank 0:  40  60  80            ->  common {40, 60}  ->  every rank loads 60
    rank 1:  40  60     (80 was being written)

The same allgather carries what wrote each file (``_files.WRITTEN_BY``) and
what each rank is now (rank count, rank, the split of its models), so a
snapshot that another rank count or another split wrote is refused on every
rank, with the same message, before any rank loads a byte of it: its arrays
would not fit (a data-parallel iterator's order of another length, another
stage's layers) or, worse, would. Files of ranks beyond this job's count are
seen too, so a file written by a rank that is not there is never ignored.
The newest iteration any rank holds is checked even where no iteration is
complete on every rank: a job of 4 ranks finding 2 ranks' snapshots refuses
them rather than start afresh.
"""
import os
from typing import Any, Dict, List, NamedTuple, Optional

import chainer
from chainer import serializers

from ..communicators._facade import Communicator, require_communicator
from . import _files as files


def find_common_snapshot(comm: Communicator, directory: str,
                         prefix: str = "snapshot") -> Optional[int]:
    """The newest iteration that every rank snapshotted completely; collective.

    Args:
        comm: the mnpar communicator; every rank must call this.
        directory: where the snapshots are (each rank reads its own files).
        prefix: the snapshots' name prefix.

    Returns:
        int or None: the same iteration on every rank, or None on every rank
        if no iteration is complete everywhere (or there are no snapshots).
    """
    common = common_iterations(comm, directory, prefix)
    return common[-1] if common else None


def common_iterations(comm: Communicator, directory: str, prefix: str = "snapshot") -> List[int]:
    """The iterations that every rank snapshotted completely, ascending; collective."""
    everyone = comm.allgather_obj(files.complete_iterations(directory, comm.rank, prefix))
    return sorted(set(everyone[0]).intersection(*everyone[1:]))


class Survey(NamedTuple):
    """One rank's snapshots and what it is: the allgather of ``survey``."""

    iterations: List[int]  # complete, ascending
    written: Dict[int, Optional[files.Layout]]  # iteration -> what wrote its file
    beyond: Dict[int, int]  # iteration -> highest rank >= size with a file of it here
    now: files.Layout  # what loads: this job's rank count, the rank, its splits


def survey(comm: Communicator, directory: str, prefix: str, target: Any) -> List[Survey]:
    """Every rank's ``Survey`` of ``directory`` for loading ``target``; collective."""
    mine = files.complete_iterations(directory, comm.rank, prefix)
    written = {i: files.written_by(os.path.join(
        directory, files.snapshot_filename(i, comm.rank, prefix))) for i in mine}
    return comm.allgather_obj(Survey(mine, written,
                                     files.other_ranks(directory, prefix, comm.size),
                                     files.layout_of(target, comm.size, comm.rank)))


def loadable(op: str, directory: str, prefix: str, surveys: List[Survey]) -> List[int]:
    """The iterations complete on every rank, once the newest snapshot any rank holds
    (its own file, or one of a rank beyond this job's) is known to be this job's rank
    count and split; else ``ValueError``, the same on every rank (the surveys are)."""
    everyone = [s.iterations for s in surveys]
    common = sorted(set(everyone[0]).intersection(*everyone[1:]))
    held = [i for s in surveys for i in (*s.iterations, *s.beyond)]  # any rank's, any file
    newest = common[-1] if common else max(held, default=None)
    if newest is not None:
        check_written_by(op, directory, prefix, newest, surveys)
    return common


def check_written_by(op: str, directory: str, prefix: str, iteration: int,
                     surveys: List[Survey]) -> None:
    """Raises ``ValueError`` if ``iteration``'s snapshot was written by another rank count
    or split than the surveys' ranks are now, naming what wrote it and what loads it."""
    size = len(surveys)
    name = f"snapshot {files.snapshot_filename(iteration, 0, prefix)[:-len('.rank0.npz')]}"
    fix = ("a snapshot loads only under the rank count and the split that wrote it: run "
           "the job that way, or resume from another directory")
    beyond = max((s.beyond.get(iteration, -1) for s in surveys), default=-1)
    if beyond >= 0:
        raise ValueError(
            f"{op}: {name} in {directory!r} was written by at least {beyond + 1} ranks (the "
            f"file of rank {beyond} is there) and is loaded by {size} "
            f"rank{'s' * (size != 1)}; {fix}")
    for r, s in enumerate(surveys):
        wrote = s.written.get(iteration)
        if wrote is None:  # no record (an older file): only the names tell
            continue
        file = files.snapshot_filename(iteration, r, prefix)
        if wrote.get("ranks") != size:
            raise ValueError(
                f"{op}: {name} in {directory!r} was written by {wrote.get('ranks')} ranks and "
                f"is loaded by {size} rank{'s' * (size != 1)}: {file} was written by "
                f"{files.describe(wrote)}, and {files.describe(s.now)} loads it; {fix}")
        if wrote.get("splits", {}) != s.now["splits"]:
            raise ValueError(
                f"{op}: {name} in {directory!r} was written under another split: {file} was "
                f"written by {files.describe(wrote)}, and {files.describe(s.now)} loads it; "
                f"{fix}")


def resume(comm: Communicator, trainer: Any, path: Optional[str] = None, prefix: str = "snapshot",
           iteration: Optional[int] = None) -> Optional[int]:
    """Loads every rank's trainer from the same snapshot; collective.

    Call it after building the trainer and adding its extensions, before
    ``trainer.run()``.

    Args:
        comm: the mnpar communicator; every rank must call this.
        trainer: this rank's ``chainer.training.Trainer``.
        path: the directory of the snapshots, or one snapshot file of any
            rank (e.g. ``result/snapshot_iter_120.rank0.npz``): every rank
            then loads its own file of that iteration and prefix. It must
            exist on every rank. Default ``trainer.out``, where no snapshot
            at all means a fresh start.
        prefix: the snapshots' name prefix (taken from ``path`` if a file).
        iteration: the iteration to load; default the newest that every
            rank wrote completely (or the one ``path`` names).

    Returns:
        int or None: the iteration loaded (the same on every rank), or None
        when no snapshot is complete on every rank (nothing is loaded; the
        run starts afresh).

    Raises:
        TypeError: ``comm`` is not an mnpar communicator, or ``trainer`` not
            a ``chainer.training.Trainer``.
        FileNotFoundError: on every rank, if ``path`` is given and its
            directory is missing on some rank.
        ValueError: on every rank, if an iteration was asked for and some
            rank has no complete snapshot of it, or ``path`` is a file that
            is not a snapshot; on every rank, before anything is loaded, if
            the snapshot to load (or, where none is complete on every rank,
            the newest any rank holds) was written by another number of
            ranks or under another split (the MultiNodeChainList wiring or
            ``build_stage`` cut of a model): the message says what wrote it
            and what loads it.
        RuntimeError: a loaded snapshot holds another iteration than its name says.

    Example::

        trainer.extend(mnpar.extensions.snapshot(comm, trigger=(100, "iteration")))
        start = mnpar.extensions.resume(comm, trainer)
        if comm.rank == 0 and start is not None:
            print(f"resumed from iteration {start}")
        trainer.run()
    """
    require_communicator(comm, "resume")
    if not isinstance(trainer, chainer.training.Trainer):
        raise TypeError(f"resume needs this rank's chainer.training.Trainer, not "
                        f"{type(trainer).__name__}")
    directory, prefix, iteration = _target(trainer.out if path is None else path, prefix,
                                           iteration)
    if path is not None:
        missing = [r for r, found in enumerate(comm.allgather_obj(os.path.isdir(directory)))
                   if not found]
        if missing:
            raise FileNotFoundError(f"resume: path={path!r}: directory {directory!r} does not "
                                    f"exist on rank(s) {missing}")
    surveys = survey(comm, directory, prefix, trainer)
    if iteration is None:
        common = loadable("resume", directory, prefix, surveys)
        if not common:
            return None
        iteration = common[-1]
    else:
        check_written_by("resume", directory, prefix, iteration, surveys)
        everyone = [s.iterations for s in surveys]
        missing = [r for r, its in enumerate(everyone) if iteration not in its]
        if missing:
            raise ValueError(
                f"iteration={iteration}: rank(s) {missing} have no complete "
                f"{files.snapshot_filename(iteration, missing[0], prefix)!r} in "
                f"{directory!r}; complete iterations per rank: {everyone}")
    file = os.path.join(directory, files.snapshot_filename(iteration, comm.rank, prefix))
    serializers.load_npz(file, trainer)
    loaded = int(trainer.updater.iteration)
    if loaded != iteration:
        raise RuntimeError(f"rank {comm.rank}: {file!r} holds a trainer at iteration "
                           f"{loaded}, not {iteration} as its name says")
    return iteration


def _target(path: str, prefix: str, iteration: Optional[int]):
    """``(directory, prefix, iteration)`` from a directory or a snapshot file name."""
    if os.path.isdir(path) or not os.path.basename(path).endswith(".npz"):
        return path, prefix, None if iteration is None else int(iteration)
    parsed = files.parse_snapshot_filename(path)
    if parsed is None:
        raise ValueError(f"path={path!r} is neither a directory nor a snapshot file name "
                         f"like {files.snapshot_filename(120, 0, prefix)!r}")
    named_prefix, named_iteration, _ = parsed
    if iteration is not None and int(iteration) != named_iteration:
        raise ValueError(f"iteration={iteration} contradicts path={path!r}")
    return os.path.dirname(path) or ".", named_prefix, named_iteration
