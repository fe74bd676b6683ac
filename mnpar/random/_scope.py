"""``scope``: chainer's random functions drawing numbers that do not depend on the split.

Inside a scope, a draw's numbers are Philox's for (seed, place, step,
element), where the place is the call's place in the model (``_places``),
the step is ``optimizer.t`` and the element is its index in the whole array
(``_position``). One process and every split of the same model run under
the same scope draw the same numbers for the same elements::

    one process          rows 0..63 of /blk[2]'s dropout     numbers N[0:64]
    pipeline, K = 4      micro-batch 1: rows 16..31          numbers N[16:32]
    2 replicas           replica 1: rows 32..63              numbers N[32:64]
    2 x 2 tiles          the tile's rows and columns         its slice of N

chainer's random functions get their numbers through ``_draws``; a draw of
NumPy's or cupy's global generator made inside the model is none of these,
and is named in a ``RandomWarning`` once (its numbers stay the split's own).
"""
import hashlib
import threading
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import chainer
import numpy as np
from chainer.functions.rnn import n_step_rnn

from .._arrays import cupy_module
from ..communicators._facade import Communicator, require_communicator
from . import _draws, _philox, _places, _position


class RandomWarning(UserWarning):
    """A draw inside a scope that does not draw by place (NumPy's or cupy's own generator)."""


def _key(seed: int, place: str) -> Tuple[int, int]:
    digest = hashlib.blake2b(f"{seed}|{place}".encode(), digest_size=16).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")


class _Hook(chainer.FunctionHook):
    """Gives each random function node its numbers before its forward."""

    name = "mnpar.random"

    def __init__(self, source: _draws.Source) -> None:
        self.source = source

    def forward_preprocess(self, function: Any, in_data: Any) -> None:
        _draws.give(function, in_data, self.source)


class _Active(threading.local):
    def __init__(self) -> None:
        self.scope: Any = None  # the active scope


_active = _Active()


def active() -> bool:
    """Whether a ``mnpar.random.scope`` is active in this thread."""
    return _active.scope is not None


Roots = Union[chainer.Link, Dict[str, chainer.Link]]


class scope:
    """Within it, chainer's random functions draw what one process draws, under any split.

    Wrap training in it, in one process and in every split alike: dropout,
    ``F.gaussian``, ``F.rrelu``, ``F.zoneout``, ``F.simplified_dropconnect``,
    ``F.gumbel_softmax`` and the samplers of ``NegativeSampling`` and
    ``BlackOut`` then draw numbers that are a function of the seed, the call's
    place in the model, the step and each element's index in the whole array,
    so a pipeline, tiles, replicas, tensor shards and one process draw the same
    numbers for the same elements (and a recomputed forward draws the same
    numbers again, on CPUs and GPUs).

    Args:
        model: the model whose link paths name the places: the whole model (a
            pipeline: the Sequential given to ``build_stage``); or, for pieces
            built apart (``MultiNodeChainList``), a dict of each piece by its
            path in the one-process model (``{"/0": encoder}``).
        optimizer: its ``t`` (updates so far) numbers the steps, so every step
            draws anew and a resumed run draws what the uninterrupted one would;
            None: every forward draws as step 0 (evaluation, inference).
        seed: an int; the same on every rank.
        data: the data-parallel communicator, if the batch is split over
            replicas: replica r's batch is rows ``r * n .. (r + 1) * n`` of the
            whole batch (every replica's batch must have the same size, checked
            at each forward that draws).

    Example::

        with mnpar.random.scope(model, optimizer, seed=0):
            trainer.run()

    Raises:
        TypeError: ``model`` is not a link (or a dict of links), ``optimizer``
            not a chainer optimizer, ``data`` not an mnpar communicator.
        ValueError: a scope is already active.
    """

    def __init__(self, model: Roots, optimizer: Any = None, seed: int = 0,
                 data: Optional[Communicator] = None) -> None:
        roots = model if isinstance(model, dict) else {"": model}
        for name, link in roots.items():
            if not isinstance(link, chainer.Link):
                raise TypeError(f"mnpar.random.scope names places by a model's links: "
                                f"{name or 'model'} is a {type(link).__name__}, not a "
                                "chainer.Link")
        if optimizer is not None and not hasattr(optimizer, "t"):
            raise TypeError(f"mnpar.random.scope numbers steps by optimizer.t; "
                            f"{type(optimizer).__name__} has no t")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise TypeError(f"seed={seed!r} must be an int")
        if data is not None:
            require_communicator(data, "mnpar.random.scope(data=...)")
        self.places = _places.Places(roots)
        self.optimizer = optimizer
        self.seed = int(seed)
        self.data = data
        self._hook = _Hook(self)
        self._swaps = _draws.Swapped(self)
        self._watch = _Watch(self)
        self._checked: Optional[int] = None  # the forward whose batch size was checked
        self._saved_forward: Any = None

    def __enter__(self) -> "scope":
        if _active.scope is not None:
            raise ValueError("mnpar.random.scope: a scope is already active; use one")
        _active.scope = self
        self._saved_forward = chainer.Sequential.__dict__["forward"]
        chainer.Sequential.forward = _places.sequential_forward  # type: ignore[method-assign]
        self.places.__enter__()
        self._hook.__enter__()
        self._swaps.__enter__()
        self._watch.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._watch.__exit__()
        self._swaps.__exit__()
        self._hook.__exit__()
        self.places.__exit__()
        chainer.Sequential.forward = self._saved_forward  # type: ignore[method-assign]
        _active.scope = None

    def step(self) -> int:
        return int(self.optimizer.t) if self.optimizer is not None else 0

    def numbers(self, kind: str, shape: Tuple[int, ...], like: Any, batch: bool,
                what: str) -> Any:
        xp = chainer.backend.get_array_module(like) if like is not None else np
        place = self.places.place(what)
        if batch and (self.data is not None or _position.state.shares) \
                and _places.inside(n_step_rnn._dropout_sequence.__code__):
            raise ValueError(
                "mnpar.random.scope: chainer's NStep RNNs (F.n_step_lstm, n_step_gru, "
                "n_step_rnn) drop out each time step's examples sorted by their lengths, so a "
                "batch split into micro-batches or replicas does not hold the whole batch's "
                "rows in their places; give the RNN dropout 0, or do not split its batch")
        replicas = self._replicas(shape, what) if batch and shape else None
        position = _position.locate(shape, like, batch, what, replicas)
        starts, length = position.runs()
        draw = _philox.uniform if kind == "uniform" else _philox.normal
        out = draw(xp.asarray(starts), length, self.step(), _key(self.seed, place), xp)
        return out.reshape(shape)

    def _replicas(self, shape: Tuple[int, ...], what: str) -> Optional[Tuple[int, int]]:
        """(this replica, replicas) of data parallelism; the replicas' batch sizes checked
        equal once a forward."""
        if self.data is None:
            return None
        forward = self.places.forward
        if self._checked != forward:
            _, rows, _ = _position.batch_rows(int(shape[0]), what)
            sizes = self.data.allgather_obj(rows)
            if len(set(sizes)) > 1:
                raise ValueError(
                    f"mnpar.random.scope(data=...): the replicas' batches have "
                    f"{sizes} rows at {what} (rank by rank); a draw is a slice of the whole "
                    "batch only when every replica's batch has the same size (use "
                    "mnpar.scatter_dataset, whose shards are of equal length, and the same "
                    "batch size on every rank)")
            self._checked = forward
        return self.data.rank, self.data.size


class _Watch:
    """Wraps NumPy's and cupy's global draws while a scope is active: one made inside the
    model is named in a ``RandomWarning`` once (its numbers are unchanged)."""

    SKIP = {"seed", "get_state", "set_state", "get_random_state", "set_random_state",
            "get_bit_generator", "set_bit_generator", "default_rng", "reset_states"}

    def __init__(self, owner: scope) -> None:
        self.owner = owner
        self.saved: List[Tuple[Any, str, Any]] = []
        self.warned: set = set()

    def __enter__(self) -> None:
        modules = [("numpy.random", np.random)]
        cupy = cupy_module()
        if cupy is not None:
            modules.append(("cupy.random", cupy.random))
        for label, module in modules:
            for name in dir(module):
                value = getattr(module, name)
                if name.startswith("_") or name in self.SKIP or isinstance(value, type) \
                        or not callable(value) or getattr(value, "__module__", "") == "typing":
                    continue
                self.saved.append((module, name, value))
                setattr(module, name, self._wrap(f"{label}.{name}", value))

    def __exit__(self) -> None:
        for module, name, value in reversed(self.saved):
            setattr(module, name, value)
        self.saved = []

    def _wrap(self, label: str, draw: Any) -> Any:
        def watched(*args: Any, **kwargs: Any) -> Any:
            self._note(label)
            return draw(*args, **kwargs)
        return watched

    def _note(self, label: str) -> None:
        links = list(_places.innermost_links())
        if not links:
            return
        path = next((p for p in map(self.owner.places.path, links) if p is not None), None)
        where = path if path is not None else type(links[0]).__name__
        if (label, where) in self.warned:
            return
        self.warned.add((label, where))
        warnings.warn(
            f"mnpar.random.scope: {label} was drawn inside the model (in {where}): NumPy's and "
            "cupy's own generators do not draw by place, so its numbers depend on the split "
            "(they are not one process's); draw with chainer's random functions, or outside "
            "the model", RandomWarning, stacklevel=3)
