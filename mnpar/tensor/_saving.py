"""Snapshots of a split model hold whole arrays, gathered in one order on every rank.

Saving a cut parameter (or its optimizer state: Adam's moments) gathers its
parts over the group, so the file holds the array one process holds, and a
model saved at any degree loads in one process or at any other degree
(loading keeps this rank's part; no message). But chainer serializes a
link's parameters and children in the order of Python sets, which differs
from process to process (string hashes are seeded per process): ranks would
gather different arrays at the same time. So the first cut array a rank
saves gathers *every* cut array of its model, in one fixed order (the
model's parameter paths, then each one's state keys), and the later ones
take theirs from that::

    rank 0 saves: W of fc2 -> gather all (fc1 W, fc1 b, fc1 W's m, v, fc2 W ...)
                  then fc1 W, ... from what was gathered
    rank 1 saves: fc1 W    -> gather all (the same order)  ...

A gathered array serves one save of it, in the same forward: a later save
(after another forward, or of an array saved already) gathers anew, and
loading drops what was gathered.
"""
from typing import Any, Callable, Dict, List, Optional

import chainer
import chainer.serializer

from .._arrays import device_of
from ._cut import Cut, cut_of


class Wholes:
    """The cut arrays of one split model, gathered together when it is saved."""

    def __init__(self) -> None:
        self.sources: List[Callable[[], List[Any]]] = []  # each: [(array, cut), ...]
        self.version = 0  # forwards so far (the same on every rank)
        self._cache: Dict[int, List[Any]] = {}  # id(part) -> [part, whole, version, used]

    def add_param(self, param: Any) -> None:
        """Saves ``param`` and its optimizer state through this model's gathers."""
        param._mnpar_wholes = self
        self.sources.append(lambda: _param_arrays(param))

    def add_arrays(self, read: Callable[[], List[Any]]) -> None:
        """Saves the ``(array, cut)`` pairs ``read()`` returns (running statistics)."""
        self.sources.append(read)

    def whole(self, part: Any, cut: Cut, what: str) -> Any:
        """The whole array of ``part`` (gathering every cut array of the model first,
        where nothing fresh was gathered for it)."""
        entry = self._cache.get(id(part))
        if entry is None or entry[0] is not part or entry[2] != self.version or entry[3]:
            self._gather_all()
            entry = self._cache.get(id(part))
        if entry is None:  # not one of the model's: gathered alone
            return cut.whole(part, what)
        entry[3] = True
        return entry[1]

    def forget(self) -> None:
        self._cache.clear()

    def _gather_all(self) -> None:
        self._cache = {}
        for read in self.sources:
            for array, cut in read():
                self._cache[id(array)] = [array, cut.whole(array, "saving a snapshot"),
                                          self.version, False]


def _param_arrays(param: Any) -> List[Any]:
    cut = cut_of(param)
    if cut is None or param.array is None:
        return []
    out = [(param.array, cut)]
    rule = param.update_rule
    state: Dict[str, Any] = (getattr(rule, "state", None) if rule is not None else None) or {}
    for key in state:
        value = state[key]
        if hasattr(value, "shape") and tuple(value.shape) == tuple(param.array.shape):
            out.append((value, cut))
    return out


class CutSaver(chainer.serializer.Serializer):
    """Passes whole arrays to ``target``: the parts of ``cuts`` gathered over their group."""

    def __init__(self, target: Any, cuts: Dict[str, Cut], default: Optional[Cut],
                 wholes: Optional[Wholes]) -> None:
        self.target = target
        self.cuts = cuts
        self.default = default
        self.wholes = wholes

    def __getitem__(self, key: str) -> Any:
        return CutSaver(self.target[key], {}, None, self.wholes)

    def __call__(self, key: str, value: Any) -> Any:
        cut = self.cuts.get(key, self.default)
        if cut is None or value is None or not hasattr(value, "shape") or key == "t":
            return self.target(key, value)
        what = f"saving {key!r}"
        whole = self.wholes.whole(value, cut, what) if self.wholes else cut.whole(value, what)
        self.target(key, whole)
        return value


class CutLoader(chainer.serializer.Deserializer):
    """Reads whole arrays from ``target`` and keeps the parts of ``cuts``."""

    def __init__(self, target: Any, cuts: Dict[str, Cut], default: Optional[Cut],
                 wholes: Optional[Wholes]) -> None:
        self.target = target
        self.cuts = cuts
        self.default = default
        if wholes is not None:
            wholes.forget()

    def __getitem__(self, key: str) -> Any:
        return CutLoader(self.target[key], {}, None, None)

    def __call__(self, key: str, value: Any) -> Any:
        cut = self.cuts.get(key, self.default)
        if cut is None or key == "t":
            return self.target(key, value)
        whole = self.target(key, None)
        if whole is None or not hasattr(whole, "shape"):
            return whole
        mine = cut.part(whole)
        if value is None:
            return mine
        if tuple(value.shape) != tuple(mine.shape):
            raise ValueError(f"loading {key!r}: this rank's part of the saved {whole.shape} "
                             f"is {mine.shape}, but it holds {value.shape} (a snapshot of "
                             "another model?)")
        with device_of(value):
            value[...] = chainer.backend.get_device_from_array(value).send(mine)
        return value


def wrap(serializer: Any, cuts: Dict[str, Cut], default: Optional[Cut] = None,
         wholes: Optional[Wholes] = None) -> Any:
    """``serializer`` seen through the cuts (names to cuts; ``default`` for every array)."""
    if isinstance(serializer, chainer.serializer.Deserializer):
        return CutLoader(serializer, cuts, default, wholes)
    return CutSaver(serializer, cuts, default, wholes)
