"""What every split link shares: its group, its cuts, refusals that name it, and saving.

A link of the user's model is split in place (its class becomes the split
subclass: same parameters, names and optimizer slots), so ``copyparams``,
snapshots and the optimizer see the link they know. ``Split`` holds what the
split subclasses share; ``TensorParallelError`` messages name the link by
its path in the parallelized model.
"""
from typing import Any, Dict, Optional, Tuple

import chainer

from ..functions._group_ops import Bounds, balanced
from ._errors import TensorParallelError
from ._marks import Shard, mark_of, state
from ._params import Cut, cut_of, cut_param
from ._saving import wrap


def link_error(plain: type, path: str, style: Any, text: str) -> TensorParallelError:
    return TensorParallelError(f"{plain.__name__} {path!r} planned {style!r}: {text}")


def cut_problem(total: int, unit: int, size: int, what: str) -> str:
    """Why ``total`` cannot be cut over ``size`` ranks in whole ``unit``s ('' if it can)."""
    if total % unit:
        return f"its {total} {what} are no whole number of units of {unit}"
    if total // unit < size:
        units = f"{total // unit} units of {unit}" if unit > 1 else f"only {total}"
        return f"its {total} {what} make {units}, fewer than the {size} ranks of the tensor group"
    return ""


class Split:
    """Mixed into the split subclasses of chainer's links (``_tp_*`` attributes)."""

    _tp_comm: Any
    _tp_path: str
    _tp_style: Any
    _tp_plain: type

    def _tp_setup(self, comm: Any, path: str, style: Any, plain: type) -> None:
        self._tp_comm = comm
        self._tp_path = path
        self._tp_style = style
        self._tp_plain = plain

    def _tp_error(self, text: str) -> TensorParallelError:
        return link_error(self._tp_plain, self._tp_path, self._tp_style, text)

    def _tp_cut(self, names: Tuple[str, ...], axis: int, bounds: Bounds) -> None:
        for name in names:
            param = getattr(self, name, None)
            if param is not None:
                cut_param(param, Cut(self._tp_comm, axis, bounds))

    def _tp_bounds(self, total: int, unit: int, what: str) -> Bounds:
        """``total`` cut over the group in whole ``unit``s, or refused."""
        problem = cut_problem(total, unit, self._tp_comm.size, what)
        if problem:
            raise self._tp_error(problem)
        return balanced(total, self._tp_comm.size, unit)

    def _tp_running(self) -> None:
        if not state.scopes:
            raise self._tp_error("a split link runs only inside the forward of the model "
                                 "given to mnpar.tensor.parallelize (call the model, not the "
                                 "link alone)")

    def _tp_shard(self, axis: int, total: int, bounds: Bounds) -> Shard:
        return Shard(self._tp_comm, axis, total, bounds)

    def _tp_mark(self, x: Any) -> Optional[Shard]:
        return mark_of(x)

    def serialize(self, serializer: Any) -> None:
        cuts: Dict[str, Cut] = dict(getattr(self, "_tp_persistent_cut", {}))
        for name in self._params:  # type: ignore[attr-defined]
            cut = cut_of(getattr(self, name, None))
            if cut is not None:
                cuts[name] = cut
        super().serialize(wrap(serializer, cuts, None,  # type: ignore[misc]
                               getattr(self, "_tp_wholes", None)))

    def _tp_register(self, wholes: Any) -> None:
        """Saves this link's cut arrays through its model's gathers (``_saving``)."""
        self._tp_wholes = wholes
        for name in sorted(self._params):  # type: ignore[attr-defined]
            param = getattr(self, name)
            if cut_of(param) is not None:
                wholes.add_param(param)
        persistent = getattr(self, "_tp_persistent_cut", {})
        if persistent:
            wholes.add_arrays(lambda: [(getattr(self, n), c)
                                       for n, c in sorted(persistent.items())])

    def mnpar_replicas(self) -> Any:
        """The parameters every rank of the group holds alike, for
        ``mnpar.optimizer_hooks.GradientClipping``: each counts once."""
        whole = [p for p in self.params() if cut_of(p) is None]  # type: ignore[attr-defined]
        return [(self._tp_comm, whole)] if whole and self._tp_comm.size > 1 else []


def plain_class(link: chainer.Link) -> type:
    """The chainer class a split link was made from."""
    return getattr(link, "_tp_plain", type(link))
