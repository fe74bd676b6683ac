"""Parameters cut over the tensor group, initialized and saved as one process's.

A cut parameter keeps this rank's part of the whole one along one axis
(``Cut``: the group, the axis, every rank's bounds). Its values are one
process's, sliced:

* a parameter the model already holds (the model was built as in one
  process, with the same seed on every rank) is sliced, and the whole array
  dropped;
* one not yet initialized (``L.Linear(None, n)``) draws the whole array with
  its own initializer at its first forward, as one process does at the same
  point (so every later draw of NumPy's generator is one process's too),
  and keeps its part. The whole array lives on the rank for the draw only.

Snapshots hold whole arrays (``_saving``): a model saved at any degree, or
in one process, loads at any other.
"""
from typing import Any, Tuple

import chainer

from .._arrays import device_of
from ._cut import Cut, cut_of
from ._saving import wrap

__all__ = ["Cut", "cut_of", "CutParameter", "cut_param", "initialize_cut"]


class CutParameter(chainer.Parameter):
    """A ``chainer.Parameter`` holding its part; its update rule saves whole states."""

    _mnpar_cut: Cut

    @property
    def update_rule(self) -> Any:
        return self.__dict__.get("update_rule")

    @update_rule.setter
    def update_rule(self, rule: Any) -> None:
        if rule is not None and not getattr(rule, "_mnpar_cut_serialize", False):
            plain = rule.serialize
            cut = self._mnpar_cut

            def serialize(serializer: Any) -> None:
                plain(wrap(serializer, {}, cut, getattr(self, "_mnpar_wholes", None)))

            rule.serialize = serialize
            rule._mnpar_cut_serialize = True
        self.__dict__["update_rule"] = rule

    def __reduce__(self) -> Any:
        fn, args = super().__reduce__()
        return _recover, (fn, args, self._mnpar_cut)


def _recover(fn: Any, args: Any, cut: Cut) -> CutParameter:
    param = fn(*args)
    rule = param.update_rule
    param.__class__ = CutParameter
    param._mnpar_cut = cut
    param.update_rule = rule
    return param


def cut_param(param: Any, cut: Cut) -> None:
    """Makes ``param`` hold its part (sliced now, or drawn whole at initialization)."""
    rule = param.update_rule
    param.__class__ = CutParameter
    param._mnpar_cut = cut
    param.update_rule = rule
    if param.array is not None:
        with device_of(param.array):
            param.array = cut.part(param.array)
        param.grad = None


def initialize_cut(param: Any, whole: Tuple[Any, ...]) -> None:
    """Draws ``param``'s whole array with its initializer, as one process does, and keeps
    its part."""
    cut = cut_of(param)
    assert cut is not None
    param.initialize(whole)
    with device_of(param.array):
        param.array = cut.part(param.array)
    param.grad = None
