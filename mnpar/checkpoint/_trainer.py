"""A trainer's state beyond its models and optimizers: chainer's own serialization.

Everything a ``chainer.training.Trainer`` serializes (the updater's
iteration, its iterators, the extensions and their triggers, the stop
trigger, the elapsed time) is saved as values named ``trainer/<path>``, the
paths of chainer's snapshots. The models and optimizers are left out of this
walk (``_holdings`` saves them as parts): while it runs, the updater's
optimizers are stand-ins that serialize nothing.

Loading walks the trainer the same way with chainer's own ``NpzDeserializer``
over the values, so every value takes its type exactly as a chainer snapshot
would give it.
"""
import contextlib
from typing import Any, Dict, Iterator

import chainer
import numpy as np
from chainer.serializers import NpzDeserializer

from ._errors import CheckpointError

PREFIX = "trainer/"


class _Collect(chainer.serializer.Serializer):
    """Records every value a serialization writes, by its path."""

    def __init__(self, out: Dict[str, Any], path: str = "") -> None:
        self.out = out
        self.path = path

    def __getitem__(self, key: str) -> "_Collect":
        return _Collect(self.out, self.path + key.strip("/") + "/")

    def __call__(self, key: str, value: Any) -> Any:
        self.out[self.path + key.lstrip("/")] = value
        return value


class _Stub:
    """An optimizer (and its target) that serializes nothing."""

    def __init__(self) -> None:
        self.target = self

    def serialize(self, serializer: Any) -> None:
        return None


@contextlib.contextmanager
def _without_models(trainer: Any) -> Iterator[None]:
    updater = trainer.updater
    if not hasattr(updater, "_optimizers"):
        raise CheckpointError(f"the trainer's updater {type(updater).__name__} keeps no "
                              "_optimizers as chainer's StandardUpdater does; save its models "
                              "with their optimizers instead of the trainer")
    saved = updater._optimizers
    updater._optimizers = {name: _Stub() for name in saved}
    try:
        yield
    finally:
        updater._optimizers = saved


def optimizers_of(trainer: Any) -> Dict[str, Any]:
    """The trainer's optimizers by name, as the updater holds them."""
    return dict(trainer.updater.get_all_optimizers())


def trainer_values(trainer: Any) -> Dict[str, Any]:
    """``trainer/<path>`` -> value, for everything but the models and optimizers (also
    for a trainer not yet run, whose elapsed time chainer cannot tell: 0)."""
    out: Dict[str, Any] = {}
    fresh = getattr(trainer, "_start_at", 0) is None and not getattr(trainer, "_done", True)
    if fresh:
        trainer._done, trainer._final_elapsed_time = True, 0.0
    try:
        with _without_models(trainer):
            trainer.serialize(_Collect(out))
    finally:
        if fresh:
            trainer._done = False
    return {PREFIX + k: v for k, v in out.items()}


def load_trainer_values(trainer: Any, values: Dict[str, np.ndarray]) -> None:
    """Sets the trainer's state from ``values`` (``trainer/<path>`` -> array, None as an
    object array), as ``chainer.serializers.load_npz`` would."""
    plain = {k[len(PREFIX):]: v for k, v in values.items() if k.startswith(PREFIX)}
    with _without_models(trainer):
        trainer.serialize(NpzDeserializer(plain, strict=True))
