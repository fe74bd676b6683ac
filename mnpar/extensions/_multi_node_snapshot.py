"""Chainer's snapshot extension on many ranks, written once per replica set.

Ranks often hold the same state: in data parallelism every rank's model is
the same, yet only rank 0 carries ``LogReport`` and ``PrintReport``. The user
describes which ranks are replicas of each other; in each such set only the
lowest rank (its *master*) writes, under the snapshot's own file name with
``.<rank>`` appended, and on an autoloading restart the master loads its
newest file and sends the loaded state to the other ranks of its set::

    replica_sets=[0], 4 ranks  ->  sets {0} and {1, 2, 3}
    rank 0 writes snapshot_iter_40.0      rank 1 writes snapshot_iter_40.1
    restart: rank 0 loads .0              rank 1 loads .1, sends it to 2 and 3

The file names and the sets follow ChainerMN's, so its snapshots load here.
Unlike ChainerMN, the wrapper keeps the snapshot's own trigger and priority,
a mistaken replica set is a ``ValueError`` or ``TypeError`` instead of an
``assert``, and on a restart the masters compare the iterations they loaded:
trainers resumed from different iterations are an error on every rank.

Each file also records what wrote it (the rank count, the replica set, how
the models are split: ``_files.WRITTEN_BY``, added by the snapshot's writer,
which chainer's ``load_npz`` never reads). Before an autoloading restart
loads anything, the masters say what wrote their newest file and every rank
checks it against what it is now: a snapshot of another rank count, replica
set or split is a ``ValueError`` on every rank naming both (a file with no
record, ChainerMN's own, is loaded as before).
"""
import io
import numbers
import os
from typing import Any, Dict, Iterable, List, Optional, Set

from chainer.serializers import load_npz, save_npz
from chainer.training import extension
from chainer.training.extensions._snapshot import _find_latest_snapshot

from ..communicators._facade import Communicator, require_communicator
from . import _files as files


def parse_replica_sets(replica_sets: Iterable[Any], size: int) -> List[Set[int]]:
    """The replica sets as disjoint sets covering ``range(size)``.

    Each entry is one rank or an iterable of ranks; the ranks no entry names
    form one more set. ``[]`` therefore puts every rank in one set.

    Raises:
        TypeError: ``replica_sets`` or an entry is not a rank or ranks.
        ValueError: a rank out of range, an empty entry, or a rank in two entries.
    """
    if isinstance(replica_sets, (str, bytes)) or not isinstance(replica_sets, Iterable):
        raise TypeError(
            f"replica_sets must be a list whose entries are ranks or iterables of ranks "
            f"(e.g. [0] or [[0, 1], [2, 3]]; [] puts every rank in one set), not "
            f"{type(replica_sets).__name__} {replica_sets!r}")
    sets: List[Set[int]] = []
    owner: Dict[int, int] = {}
    for index, entry in enumerate(replica_sets):
        ranks = [entry] if _is_rank(entry) else _ranks_of(entry, index)
        if not ranks:
            raise ValueError(f"replica_sets[{index}]={entry!r} is empty")
        for rank in ranks:
            if not 0 <= rank < size:
                raise ValueError(f"replica_sets[{index}] names rank {rank}, out of range for "
                                 f"a communicator of size {size}")
            if owner.get(rank, index) != index:
                raise ValueError(f"rank {rank} is in replica_sets[{owner[rank]}] and "
                                 f"replica_sets[{index}]; a rank belongs to one set")
            owner[rank] = index
        sets.append({int(r) for r in ranks})
    rest = set(range(size)) - set(owner)
    if rest:
        sets.append(rest)
    return sets


def _is_rank(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _ranks_of(entry: Any, index: int) -> List[int]:
    if isinstance(entry, (str, bytes)) or not isinstance(entry, Iterable):
        raise TypeError(f"replica_sets[{index}]={entry!r} must be a rank or an iterable of "
                        f"ranks, not {type(entry).__name__}")
    ranks = list(entry)
    bad = [r for r in ranks if not _is_rank(r)]
    if bad:
        raise TypeError(f"replica_sets[{index}] holds {bad[0]!r} "
                        f"({type(bad[0]).__name__}); ranks are ints")
    return ranks


class MultiNodeSnapshot(extension.Extension):
    """Wraps a chainer snapshot; create it with :func:`multi_node_snapshot`."""

    def __init__(self, comm: Communicator, snapshot: Any, replica_sets: Iterable[Any]) -> None:
        require_communicator(comm, "multi_node_snapshot")
        if not callable(snapshot) or not hasattr(snapshot, "filename"):
            raise TypeError(
                f"multi_node_snapshot wraps chainer.training.extensions.snapshot() or "
                f"snapshot_object(), not {type(snapshot).__name__} (mnpar.extensions."
                f"snapshot already writes one file per rank and needs no wrapper)")
        sets = parse_replica_sets(replica_sets, comm.size)
        self.comm = comm
        self.snapshot = snapshot
        self.replica_set = next(s for s in sets if comm.rank in s)
        self.master = min(self.replica_set)
        self.trigger = getattr(snapshot, "trigger", (1, "epoch"))
        self.priority = getattr(snapshot, "priority", extension.PRIORITY_READER)
        snapshot.filename = _with_rank(snapshot.filename, comm.rank)
        self._writer: Optional[_Recording] = None
        if getattr(snapshot, "writer", None) is not None:
            self._writer = snapshot.writer = _Recording(snapshot.writer)

    @property
    def is_master(self) -> bool:
        """Whether this rank writes (and on a restart loads) for its replica set."""
        return self.master == self.comm.rank

    def initialize(self, trainer: Any) -> None:
        """On the master, the snapshot's own initialize (autoload); then the set's sync.

        Collective over the communicator when the snapshot autoloads.
        """
        autoload = getattr(self.snapshot, "autoload", False)
        target = trainer if self.snapshot._target is None else self.snapshot._target
        if autoload:
            self._check_written_by(trainer, target)
        if self.is_master:
            self.snapshot.initialize(trainer)
        if not autoload:
            return
        if self.is_master:
            data = None
            if _find_latest_snapshot(self.snapshot.filename, trainer.out) is not None:
                buf = io.BytesIO()
                save_npz(buf, target)
                data = buf.getvalue()
            for rank in sorted(self.replica_set - {self.comm.rank}):
                self.comm.send_obj(data, rank)
        else:
            data = self.comm.recv_obj(self.master)
            if data is not None:
                load_npz(io.BytesIO(data), target)
        self._check_same_iteration(trainer, loaded=data is not None)

    def _layout(self, target: Any) -> files.Layout:
        return files.layout_of(target, self.comm.size, self.comm.rank,
                               replica_set=sorted(self.replica_set))

    def _check_written_by(self, trainer: Any, target: Any) -> None:
        """Raises on every rank, before any loads, if a master's newest snapshot was
        written by another rank count, replica set or split; collective."""
        name = wrote = None
        if self.is_master:
            name = _find_latest_snapshot(self.snapshot.filename, trainer.out)
            if name is not None:
                wrote = files.written_by(os.path.join(trainer.out, name))
        everyone = self.comm.allgather_obj((name, wrote, self._layout(target)))
        for name, wrote, now in everyone:
            if wrote is None:
                continue
            if any(wrote.get(key) != now[key] for key in ("ranks", "replica_set", "splits")):
                raise ValueError(
                    f"multi_node_snapshot: {name} in {trainer.out!r} was written by "
                    f"{files.describe(wrote)}, and {files.describe(now)} loads it; a "
                    f"snapshot loads only under the rank count, replica sets and split that "
                    f"wrote it: run the job that way, or resume from another directory")

    def _check_same_iteration(self, trainer: Any, loaded: bool) -> None:
        """Raises on every rank if the masters' trainers resumed from different iterations.

        A master with no snapshot counts as iteration 0. Only trainers are
        compared (``snapshot_object`` targets have no iteration); collective.
        """
        is_trainer = self.snapshot._target is None
        iteration = int(trainer.updater.iteration) if loaded and is_trainer else 0
        everyone = self.comm.allgather_obj((self.master, is_trainer, loaded, iteration))
        if not all(t for _, t, _, _ in everyone):
            return
        masters = {m: (did, it) for m, _, did, it in everyone}
        if len({it for _, it in masters.values()}) <= 1:
            return
        listing = ", ".join(f"rank {m}: " + (f"iteration {it}" if did else "no snapshot")
                            for m, (did, it) in sorted(masters.items()))
        raise RuntimeError(
            f"multi_node_snapshot: the replica sets resumed from different iterations "
            f"({listing}); remove the newer snapshot files so that every set's newest "
            f"snapshot is of the same iteration")

    def on_error(self, trainer: Any, exc: BaseException, tb: Any) -> None:
        if self.is_master:
            self.snapshot.on_error(trainer, exc, tb)

    def __call__(self, trainer: Any) -> None:
        if self.is_master:
            if self._writer is not None:
                target = trainer if self.snapshot._target is None else self.snapshot._target
                self._writer.layout = self._layout(target)
            self.snapshot(trainer)

    def finalize(self) -> None:
        if self.is_master:
            self.snapshot.finalize()


class _Recording:
    """A chainer snapshot writer that adds what writes (``layout``) to what it saves."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.layout: Optional[files.Layout] = None

    def __call__(self, filename: str, outdir: str, target: Any, *args: Any, **kwargs: Any) -> Any:
        if self.layout is not None and isinstance(target, dict):
            target = files.with_layout(target, self.layout)
        return self.writer(filename, outdir, target, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # the writer's own (finalize, cleanup hooks)
        if name == "writer":
            raise AttributeError(name)
        return getattr(self.writer, name)


def _with_rank(filename: Any, rank: int) -> Any:
    """The snapshot's file name (a format or a function of the trainer) + ``.<rank>``."""
    if callable(filename):
        def with_rank(trainer: Any) -> str:
            return f"{filename(trainer)}.{rank}"
        return with_rank
    return f"{filename}.{rank}"


def multi_node_snapshot(comm: Communicator, snapshot: Any,
                        replica_sets: Iterable[Any]) -> MultiNodeSnapshot:
    """Makes a chainer snapshot extension write once per set of replica ranks.

    ``replica_sets`` lists the ranks that hold the same state; each entry is
    one rank or an iterable of ranks, and the ranks no entry names form one
    more set:

    =====================  =====  ======================================
    replica_sets           ranks  sets
    =====================  =====  ======================================
    ``[0]``                4      ``{0}, {1, 2, 3}``
    ``[0, 1]``             4      ``{0}, {1}, {2, 3}``
    ``[[0, 1], [2, 3]]``   4      ``{0, 1}, {2, 3}``
    ``[]``                 4      ``{0, 1, 2, 3}``
    ``[range(0, 8, 2)]``   8      even ranks, odd ranks
    ``range(size)``        any    every rank its own set
    =====================  =====  ======================================

    In each set the lowest rank writes ``<filename>.<its rank>``. With the
    snapshot's ``autoload=True``, that rank loads its newest file when the
    trainer starts and sends the state to the rest of its set; the ranks then
    check that every set resumed from the same iteration (a ``RuntimeError``
    on every rank if not). Each file records the rank count, the replica set
    and how the models are split; a restart under another of these refuses
    it (a ``ValueError`` on every rank, before anything is loaded). The
    wrapper keeps the snapshot's trigger and priority.

    Args:
        comm: the mnpar communicator.
        snapshot: the extension from ``chainer.training.extensions.snapshot()``
            or ``snapshot_object()``; its ``filename`` gets ``.<rank>`` appended.
        replica_sets: the sets of ranks with identical state, as above.

    Returns:
        The extension; pass it to ``trainer.extend`` on every rank.

    Raises:
        TypeError: ``comm`` is not an mnpar communicator, ``snapshot`` not a
            chainer snapshot, or ``replica_sets`` not a list of ranks and rank lists.
        ValueError: a rank out of range, in two sets, or an empty set; at an
            autoloading restart, on every rank, a snapshot written by another
            rank count, replica set or split.

    Example::

        snap = chainer.training.extensions.snapshot(autoload=True)
        trainer.extend(mnpar.extensions.multi_node_snapshot(comm, snap, [0]),
                       trigger=(1, "epoch"))
    """
    return MultiNodeSnapshot(comm, snapshot, replica_sets)
