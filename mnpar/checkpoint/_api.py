"""``save`` and ``load``: a trainer, an optimizer or a model, in any layout."""
from typing import Any, Optional, Sequence

import chainer

from ._errors import CheckpointError
from ._format import Index, read_index
from ._holdings import Holdings, Value, add_model
from ._read import assign, check, read_all, unclaimed
from ._trainer import load_trainer_values, optimizers_of, trainer_values
from ._write import save as write


def holdings(target: Any, names: Any = None, index: Optional[Index] = None,
             split: Optional[bool] = None) -> Holdings:
    """What this rank holds of ``target``: a ``Trainer`` (its models, optimizers and
    state), an optimizer (chainer's, or mnpar's multi-node or sharded one, with its
    model) or a ``chainer.Link``. For a save (no ``index``) replicas each take a share of
    what they hold alike (``split``); for a load (``index``) every rank takes all it holds,
    parameters yet without data take the checkpoint's shapes and update rules without
    state get it."""
    h = Holdings(split=index is None if split is None else split)
    if isinstance(target, chainer.training.Trainer):
        for name, opt in sorted(optimizers_of(target).items()):
            add_model(h, opt, name, names, index)
        for key, value in trainer_values(target).items():
            h.values[key] = Value(value, None)
    elif isinstance(target, chainer.Link):
        add_model(h, _Bare(target), "main", names, index)
    elif hasattr(target, "target") and hasattr(target, "update"):
        add_model(h, target, "main", names, index)
    else:
        raise TypeError(f"a checkpoint holds a chainer Trainer, an optimizer or a Link, not "
                        f"{type(target).__name__}")
    return h


class _Bare:
    """A model without an optimizer, as ``add_model`` reads one."""

    def __init__(self, link: chainer.Link) -> None:
        self.target = link
        self.t = 0
        self.epoch = 0


def save(path: str, comm: Any, target: Any, names: Any = None) -> str:
    """Writes ``target``'s state on every rank of ``comm`` as the checkpoint directory
    ``path``; collective.

    Every rank writes its own file at once (its shards, or its share of what
    replicas hold), rank 0 the index; the directory appears under ``path``
    only when whole, and an existing ``path`` is never written over.

    Args:
        path: the checkpoint's directory (it must not exist); its parent must be
            a directory every rank sees.
        comm: an mnpar communicator over every rank that holds part of ``target``.
        target: a ``chainer.training.Trainer``, an optimizer (chainer's, or mnpar's
            multi-node or sharded one) or a ``chainer.Link``.
        names: where this rank's links are in the whole model (``_names``): None
            where every rank holds the whole model; the whole model (a Link) or a dict
            of path prefixes where ranks hold pieces.

    Returns:
        str: ``path``.

    Raises:
        CheckpointError: on every rank, naming the array or the rank: ``path``
            exists, a rank could not write, or the ranks' pieces overlap or leave
            part of an array unwritten.

    Example::

        mnpar.checkpoint.save("result/checkpoint_iter_100", comm, trainer)
    """
    h = holdings(target, names)
    iteration = (int(target.updater.iteration)
                 if isinstance(target, chainer.training.Trainer) else None)
    return write(path, comm, h, iteration)


def load(path: str, comm: Any, target: Any, names: Any = None,
         exclude: Sequence[str] = ()) -> Index:
    """Loads the checkpoint ``path`` into ``target`` on every rank of ``comm``, whatever
    layout and rank count wrote it; collective.

    Every rank first checks and reads what it needs; only when every rank has
    succeeded does any rank assign, so a refusal leaves every model as it was.

    Args:
        path: the checkpoint's directory.
        comm: an mnpar communicator over every rank that holds part of ``target``.
        target: as for :func:`save`.
        names: as for :func:`save`, for this layout.
        exclude: ``fnmatch`` patterns of names not to load (their state stays as
            it is), e.g. ``["trainer/updater/iterator:main/*"]``.

    Returns:
        Index: the checkpoint's index (``iteration``, ``ranks``, ``layout``).

    Raises:
        CheckpointError: on every rank, naming the file and the array: not a
            checkpoint, a missing or truncated or damaged file, an array or value
            missing or of another shape or dtype (another model's checkpoint), an
            array no rank's model claims (a model split another way without
            ``names``), a value held differently by the ranks that wrote it loaded at
            another rank count.

    Example::

        mnpar.checkpoint.load("result/checkpoint_iter_100", comm, trainer)
    """
    index: Any = None
    try:
        index = read_index(path)
        problem = None
    except CheckpointError as e:
        problem = str(e)
    _agree(comm, problem, path)
    h = holdings(target, names, index)
    problem = check(index, h, comm.rank, comm.size, exclude)
    _agree(comm, problem, path)
    asked = comm.allgather_obj([p.name for p in h.parts])
    _agree(comm, unclaimed(index, asked, exclude) if comm.rank == 0 else None, path)
    parts: Any = None
    try:
        parts, values = read_all(index, h, comm.rank, comm.size, exclude)
        problem = None
    except CheckpointError as e:
        problem = str(e)
    _agree(comm, problem, path)
    assign(parts, values, h)
    if isinstance(target, chainer.training.Trainer):
        load_trainer_values(target, {k: v for k, v in values.items()
                                     if h.values[k].assign is None})
    return index


def _agree(comm: Any, problem: Optional[str], path: str) -> None:
    """Raises the first rank's problem on every rank (collective)."""
    everyone = comm.allgather_obj(problem)
    bad = [(r, p) for r, p in enumerate(everyone) if p]
    if bad:
        rank, text = bad[0]
        raise CheckpointError(f"load {path!r}: rank {rank}: {text}")
