"""``parallelize``: a chainer model split inside its layers by a plan, its code unchanged.

The plan maps link paths (``fnmatch`` patterns over ``model.namedlinks()``
paths, the leading ``/`` optional) to styles (``_styles``). ``parallelize``
then, collectively over the tensor group::

    every pattern matches a link, no link gets two styles, every style fits
        its link (class, sizes against the degree)                 refused otherwise
    one allgather: every rank has the same plan and the same model
        (paths, shapes and a checksum of every parameter)          refused otherwise
    each planned link becomes its split subclass in place, keeping its part
    the model's forward runs under the guard (``_guard``), and what it
        returns must be whole on every rank

Nothing is changed before every check has passed, so a refused plan leaves
the model as it was. The layers of a ``chainer.Sequential`` run under the
guard on their own too: a pipeline stage (``mnpar.pipeline.build_stage``)
calls them without the Sequential, and each must then give whole outputs.
"""
import fnmatch
import zlib
from typing import Any, Dict, List, Tuple

import chainer

from .._arrays import to_host
from .._mesh import tensor_comm
from ._errors import TensorParallelError
from ._guard import guarded
from ._marks import mark_of, state
from ._params import cut_of
from ._saving import Wholes
from ._split_link import Split
from ._styles import Style, style_of


def _matches(pattern: str, path: str) -> bool:
    return fnmatch.fnmatchcase(path, pattern if pattern.startswith("/") else "/" + pattern)


def _assign(model: chainer.Link, plan: Dict[str, Any]) -> Dict[str, Tuple[str, Style]]:
    links = dict(model.namedlinks())
    chosen: Dict[str, Tuple[str, Style]] = {}
    for pattern, value in plan.items():
        if not isinstance(pattern, str):
            raise TypeError(f"parallelize: plan keys are link path patterns (str), not "
                            f"{pattern!r}")
        style = style_of(value, pattern)
        matched = [path for path in links if _matches(pattern, path)]
        if not matched:
            listing = ", ".join(p for p in links if p != "/")
            raise TensorParallelError(f"parallelize: the plan's pattern {pattern!r} matches no "
                                      f"link of {type(model).__name__}; its links are "
                                      f"{listing or 'none'}")
        for path in matched:
            if path in chosen and chosen[path][1] != style:
                raise TensorParallelError(
                    f"parallelize: {path!r} is split {chosen[path][1]!r} by pattern "
                    f"{chosen[path][0]!r} and {style!r} by pattern {pattern!r}")
            chosen[path] = (pattern, style)
    return chosen


def _fingerprint(model: chainer.Link, chosen: Dict[str, Tuple[str, Style]]) -> List[Any]:
    """What every rank must share: the plan, and each parameter's shape and checksum."""
    out: List[Any] = [sorted((path, repr(style)) for path, (_, style) in chosen.items())]
    for name, p in sorted(model.namedparams()):
        if p.array is None:
            out.append((name, "uninitialized"))
        else:
            host = to_host(p.array)
            out.append((name, tuple(host.shape), str(host.dtype),
                        zlib.crc32(host.tobytes())))
    return out


def _agree(comm: Any, model: chainer.Link, chosen: Dict[str, Tuple[str, Style]]) -> None:
    mine = _fingerprint(model, chosen)
    digest = zlib.crc32(repr(mine).encode())
    digests = comm.allgather_obj(digest)
    if len(set(digests)) == 1:
        return
    every = comm.allgather_obj(mine)
    for rank, other in enumerate(every):
        if other != every[0]:
            if other[0] != every[0][0]:
                raise TensorParallelError(f"parallelize: rank {rank} of the tensor group has "
                                          f"another plan than rank 0 ({other[0]} against "
                                          f"{every[0][0]})")
            diffs = [f"{a[0]!r}" for a, b in zip(other[1:], every[0][1:]) if a != b]
            if len(other) != len(every[0]):
                diffs.append("the number of parameters")
            raise TensorParallelError(
                f"parallelize: rank {rank} of the tensor group holds another model than rank "
                f"0 ({', '.join(diffs[:4])} differ): build the model alike on every rank, "
                "with the same seed (numpy.random.seed), before splitting it")


def parallelize(model: chainer.Link, mesh_or_comm: Any, plan: Dict[str, Any]) -> chainer.Link:
    """Splits ``model``'s links inside, over the tensor group, as ``plan`` says.

    The model is changed in place and returned: each planned link keeps this
    rank's part of its parameters (one process's values, sliced) and its
    forward computes its part; the model's own code runs as it is, under a
    guard that makes every chainer function that meets a part exact or
    refuses it (``TensorParallelError``). Outputs, losses and gradients are
    the ones of the same model in one process. Collective over the tensor
    group: every rank of it builds the same model (same seed) and calls
    ``parallelize`` with the same plan.

    Args:
        model: a chainer model, built as for one process.
        mesh_or_comm: a ``mnpar.Mesh`` (its ``tensor`` axis is the group) or
            the tensor group's communicator.
        plan: link path patterns (``"fc1"``, ``"/blocks/*/attention/query"``; the
            paths of ``model.namedlinks()``) mapped to styles (``"column"``,
            ``"row"``, ``Column(unit=64)``...: ``mnpar.tensor``'s style classes).

    Returns:
        ``model``, split.

    Raises:
        TypeError: the model, the mesh or the plan is not what it must be.
        TensorParallelError: a pattern that matches nothing, a link given two
            styles, a style that does not fit its link, sizes the degree
            cannot cut, or ranks that disagree on the plan or the model (on
            every rank, before anything changes).

    Example::

        mesh = mnpar.Mesh(comm, tensor=comm.size)
        model = L.Classifier(MLP())                      # same seed on every rank
        mnpar.tensor.parallelize(model, mesh, {"predictor/l1": "column",
                                               "predictor/l2": "row"})
    """
    comm = tensor_comm(mesh_or_comm, "parallelize")
    if not isinstance(model, chainer.Link):
        raise TypeError(f"parallelize needs a chainer.Link, not {type(model).__name__}")
    if not isinstance(plan, dict):
        raise TypeError(f"parallelize: plan must be a dict of link path patterns to styles, "
                        f"not {type(plan).__name__}")
    if getattr(model, "_mnpar_tensor", None) is not None:
        raise TensorParallelError(f"parallelize: {type(model).__name__} is split already")
    chosen = _assign(model, plan)
    links = dict(model.namedlinks())
    for path, (_, style) in chosen.items():
        style.check(links[path], path, comm)
    _agree(comm, model, chosen)
    wholes = Wholes()
    for path, (_, style) in sorted(chosen.items()):
        style.apply(links[path], comm, path)
        if isinstance(links[path], Split):
            links[path]._tp_register(wholes)
    roots = [model] + ([link for link in model if isinstance(link, chainer.Link)]
                       if isinstance(model, chainer.Sequential) else [])
    for root in roots:  # a Sequential's layers run alone in a pipeline's stages
        split: Any = root
        split.__class__ = _runs_split(type(root))
        split._mnpar_tensor = comm
        split._mnpar_wholes = wholes
    return model


def tensor_group(model: chainer.Link) -> Any:
    """The tensor group a model was split over by ``parallelize`` (None if it was not)."""
    return getattr(model, "_mnpar_tensor", None)


def _parts_in(y: Any) -> List[str]:
    if isinstance(y, dict):
        return [f"[{k!r}]{p}" for k, v in y.items() for p in _parts_in(v)]
    if isinstance(y, (tuple, list)):
        return [f"[{i}]{p}" for i, v in enumerate(y) for p in _parts_in(v)]
    m = mark_of(y)
    return [f" ({m.describe()})"] if m is not None else []


def _run(model: Any, cls: type, method: str, args: Any, kwargs: Any) -> Any:
    outer = not state.scopes
    if outer:
        model._mnpar_wholes.version += 1  # what was gathered for saving is old now
    with guarded(model._mnpar_tensor, model):
        y = getattr(cls, method)(model, *args, **kwargs)
        parts = _parts_in(y) if outer else []
    if parts:
        raise TensorParallelError(
            f"the forward of {type(model).__name__} (split by mnpar.tensor.parallelize) "
            f"returns a part, not a whole array: its output{parts[0]}; plan its last layer "
            "to give whole outputs (Column(gather_output=True), or 'row'), or split the "
            "model that computes the loss (L.Classifier(model)), whose loss on parts "
            "(softmax_cross_entropy over scores cut by class) is exact")
    return y


_CLASSES: Dict[type, type] = {}


def _runs_split(cls: Any) -> type:
    """``cls`` with a ``forward`` that runs under the guard (one subclass per class)."""
    if cls in _CLASSES:
        return _CLASSES[cls]

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _run(self, cls, "forward", args, kwargs)

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:  # older models define __call__
        return _run(self, cls, "__call__", args, kwargs)

    def mnpar_replicas(self: Any) -> Any:  # gradient clipping counts each once
        comm = self._mnpar_tensor
        whole = [p for p in self.params() if cut_of(p) is None]
        return [(comm, whole)] if whole and comm.size > 1 else []

    _CLASSES[cls] = type(cls.__name__, (cls,), {
        "forward": forward, "__call__": call, "mnpar_replicas": mnpar_replicas,
        "mnpar_piece": property(lambda self: self._mnpar_tensor.size > 1),
        "__module__": cls.__module__, "__doc__": cls.__doc__})
    return _CLASSES[cls]
