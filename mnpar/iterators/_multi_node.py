"""The multi-node iterator: the master's batches, broadcast to every rank.

Each ``next`` is one ``bcast_obj`` from the master carrying the batch and
the iterator's position, so the other ranks hold no dataset and mirror the
master's ``epoch``, ``is_new_epoch`` and ``epoch_detail``. The master's
shuffled order travels too, but only when it changed (a new epoch, a reset,
a load), so that a follower's snapshot loads into a plain chainer iterator as
ChainerMN's does. Examples must be arrays, or tuples or dicts of arrays, as
ChainerMN requires (a batch of strings is a ``TypeError`` on every rank);
unlike ChainerMN's, they keep their dtypes and any number of fields. An error
in the master's iterator is raised on every rank, never left as a hang.
"""
from typing import Any, Dict, Optional, Tuple

import chainer

from ..communicators._facade import Communicator, require_communicator

_STATE = ("epoch", "is_new_epoch", "current_position", "epoch_detail",
          "previous_epoch_detail")


def _state_of(iterator: Any) -> Dict[str, Any]:
    return {k: getattr(iterator, k, None) for k in _STATE}


def _order_of(iterator: Any) -> Any:
    """The shuffled order of a chainer iterator (None: in dataset order, or none kept)."""
    state = getattr(iterator, "_state", None)
    return getattr(state, "order", None)


_UNCHANGED = "unchanged"  # the order field of a state whose order the follower has


def _is_array(x: Any) -> bool:
    return hasattr(x, "dtype")


def _invalid_example(batch: Any) -> Optional[str]:
    """Why ``batch`` cannot travel as ChainerMN's iterator lets batches travel, or None."""
    for example in batch:
        fields = (example.values() if isinstance(example, dict) else
                  example if isinstance(example, tuple) else (example,))
        if not all(map(_is_array, fields)):
            return (f"the multi-node iterator takes examples that are arrays, or tuples or "
                    f"dicts of arrays (as ChainerMN's); got {type(example).__name__} "
                    f"{example!r:.80}")
    return None


def _received(stop: bool, error: Optional[Tuple[type, str]], batch: Any) -> Any:
    """The batch of one ``next``, or its error, alike on every rank."""
    if error is not None:
        kind, text = error
        raise kind(text)
    if stop:
        raise StopIteration
    return batch


class _Master(chainer.dataset.Iterator):
    """Draws batches from the actual iterator and broadcasts them."""

    def __init__(self, actual_iterator: Any, communicator: Communicator, rank_master: int) -> None:
        self.actual_iterator = actual_iterator
        self.communicator = communicator
        self.rank_master = rank_master
        self._sent_order: Any = None
        self._order_changed = True
        communicator.bcast_obj(self._position(), root=rank_master)

    def _position(self) -> Dict[str, Any]:
        """The position, and the order where it changed since the last state sent."""
        state = _state_of(self.actual_iterator)
        order = _order_of(self.actual_iterator)
        if order is self._sent_order and not self._order_changed:
            state["order"] = _UNCHANGED
        else:
            state["order"] = order
            self._sent_order, self._order_changed = order, False
        return state

    def __next__(self) -> Any:
        batch: Any = None
        error: Optional[Tuple[type, str]] = None
        stop = False
        try:
            batch = next(self.actual_iterator)
        except StopIteration:
            stop = True
        except Exception as e:  # every rank must learn of it, or they wait forever
            error = (RuntimeError, f"the multi-node iterator's master (rank {self.rank_master}) "
                                   f"failed: {e!r}")
        else:
            invalid = _invalid_example(batch)
            if invalid is not None:
                error, batch = (TypeError, invalid), None
        self.communicator.bcast_obj((stop, error, batch, self._position()), root=self.rank_master)
        return _received(stop, error, batch)

    next = __next__

    def __getattr__(self, name: str) -> Any:
        return getattr(self.actual_iterator, name)

    def reset(self) -> None:
        self.actual_iterator.reset()
        self._order_changed = True

    def finalize(self) -> None:
        self.actual_iterator.finalize()

    def serialize(self, serializer: Any) -> None:
        self.actual_iterator.serialize(serializer)
        self._order_changed = True  # a load may have written the order in place


class _Follower(chainer.dataset.Iterator):
    """Receives the master's batches and mirrors its position."""

    def __init__(self, communicator: Communicator, rank_master: int) -> None:
        self.communicator = communicator
        self.rank_master = rank_master
        self._order: Any = None
        self.previous_epoch_detail: Any = None
        self._set(communicator.bcast_obj(None, root=rank_master))

    def _set(self, state: Dict[str, Any]) -> None:
        for k in _STATE:
            setattr(self, k, state.get(k))
        order = state.get("order")
        if not isinstance(order, str):  # _UNCHANGED keeps the order held
            self._order = order

    def __next__(self) -> Any:
        stop, error, batch, state = self.communicator.bcast_obj(None, root=self.rank_master)
        self._set(state)
        return _received(stop, error, batch)

    next = __next__

    def reset(self) -> None:
        """Local only: the master's next batch brings its position."""
        self.epoch, self.is_new_epoch, self.current_position = 0, False, 0

    def serialize(self, serializer: Any) -> None:
        """Saves what a chainer iterator saves, the master's order included, so
        the snapshot loads into a plain chainer iterator too.

        Loaded, the values hold until the master's next batch brings its own;
        the order is always the master's (a follower cannot change it).
        """
        for k in ("current_position", "epoch", "is_new_epoch"):
            setattr(self, k, serializer(k, getattr(self, k)))
        if self._order is not None:
            serializer("order", self._order)
        loading = isinstance(serializer, chainer.serializer.Deserializer)
        if loading or self.previous_epoch_detail is not None:
            try:
                self.previous_epoch_detail = serializer("previous_epoch_detail",
                                                        self.previous_epoch_detail)
            except KeyError:  # a snapshot without it (an older one)
                pass


def create_multi_node_iterator(actual_iterator: Any, communicator: Communicator,
                               rank_master: int = 0) -> chainer.dataset.Iterator:
    """An iterator that gives every rank the batches of ``rank_master``'s iterator.

    Creating it and each ``next`` are collective over ``communicator``. Use it
    where the ranks of a model-parallel group must see the same batch (an
    encoder on one rank, the decoder and the labels on another).

    Args:
        actual_iterator: the iterator on ``rank_master`` (ignored elsewhere),
            e.g. ``chainer.iterators.SerialIterator(dataset, 32)``.
        communicator: an mnpar communicator.
        rank_master: the rank whose iterator draws the batches.

    Returns:
        chainer.dataset.Iterator: on the master a wrapper of
        ``actual_iterator``; elsewhere an iterator that receives its batches
        and mirrors ``epoch``, ``is_new_epoch`` and ``epoch_detail``.

    Raises:
        TypeError: ``communicator`` is not an mnpar communicator.
        ValueError: ``rank_master`` is out of range.
        RuntimeError: on every rank, when the master's iterator raised.

    Example::

        it = mnpar.iterators.create_multi_node_iterator(
            chainer.iterators.SerialIterator(train, 32) if comm.rank == 0 else None, comm)
    """
    require_communicator(communicator, "create_multi_node_iterator")
    rank_master = communicator.check_peer(rank_master, "rank_master", allow_self=True)
    if communicator.rank == rank_master:
        return _Master(actual_iterator, communicator, rank_master)
    return _Follower(communicator, rank_master)
