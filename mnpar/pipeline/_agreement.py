"""Every rank's view of one pipeline, compared in one allgather and refused on every rank.

Each rank builds its stage, updater and data from its own arguments. A rank
that cut the model with another balance trains another model (seven layers
instead of six) without a word; one whose micro-batch count or schedule
differs waits forever; one that iterates the labels where its stage expects
inputs feeds them to a layer. So what must agree is compared where it is
set, with one allgather each, and every rank raises the same ``ValueError``:

==========================  =============================================
where                       what every rank sends
==========================  =============================================
``build_stage``             balance, chunks, loop, the whole model's
                            structure (``model_fingerprint``)
``PipelineUpdater``,        schedule, micro-batches, the stage's
``PipelineEvaluator``       ``build_stage`` arguments (with the wiring
                            the runner gathers anyway)
the first step              the batch size and the arrays of an example
                            (``check_layout``), against what each rank's
                            stage takes: inputs, labels, both or nothing
==========================  =============================================
"""
import inspect
import zlib
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import chainer

from ..communicators import Communicator

Arity = Optional[Tuple[int, Optional[int]]]  # (fewest, most or None: any) input arrays


def model_fingerprint(model: chainer.Sequential) -> List[Tuple[Any, ...]]:
    """Each layer's type (or function name) and its parameters' names, shapes and dtypes."""
    layers: List[Tuple[Any, ...]] = []
    for layer in model:
        if isinstance(layer, chainer.Link):
            params = tuple((name, None if p.array is None else tuple(p.shape),
                            None if p.array is None else str(p.dtype))
                           for name, p in sorted(layer.namedparams()))
            layers.append((type(layer).__qualname__, params))
        else:
            layers.append((getattr(layer, "__qualname__", None) or type(layer).__qualname__,))
    return layers


def fingerprint_digest(fingerprint: List[Tuple[Any, ...]]) -> int:
    return zlib.crc32(repr(fingerprint).encode())


def _layer_text(layer: Tuple[Any, ...]) -> str:
    if len(layer) == 1:
        return str(layer[0])
    params = ", ".join(f"{name[1:]} {'uninitialized' if shape is None else shape} {dtype or ''}"
                       .rstrip() for name, shape, dtype in layer[1])
    return f"{layer[0]}({params})" if params else str(layer[0])


def _models_text(models: Sequence[List[Tuple[Any, ...]]]) -> str:
    """Where the ranks' models part: their first differing layer, or their lengths."""
    for i in range(max(map(len, models))):
        seen = [m[i] if i < len(m) else None for m in models]
        if any(s != seen[0] for s in seen):
            return _by_value(f"layer {i}", [_layer_text(s) if s is not None else "nothing"
                                             for s in seen], str)
    return ""


def _by_value(name: str, values: Sequence[Any], show: Callable[[Any], str] = repr) -> str:
    """``name`` a on ranks 0, 2; b on rank 1 (ranks grouped by value, in rank order)."""
    groups: List[Tuple[Any, List[int]]] = []
    for rank, value in enumerate(values):
        for seen, ranks in groups:
            if seen == value:
                ranks.append(rank)
                break
        else:
            groups.append((value, [rank]))
    parts = [f"{show(value)} on rank{'s' if len(ranks) > 1 else ''} "
             f"{', '.join(map(str, ranks))}" for value, ranks in groups]
    return f"{name} {'; '.join(parts)}"


def check_agree(op: str, views: Sequence[Dict[str, Any]], fix: str) -> None:
    """Raises ValueError (the same on every rank) unless every rank's ``views`` agree."""
    differ = []
    for key in views[0]:
        values = [view[key] for view in views]
        if all(v == values[0] for v in values):
            continue
        differ.append(_models_text(values) if key == "model" else _by_value(key, values))
    if differ:
        raise ValueError(f"{op}: the ranks disagree: {'; '.join(differ)}. {fix}")


# -- the data layout, at the first step -------------------------------------------


def input_arity(component: Any) -> Arity:
    """How many input arrays ``component`` takes, from its (first layer's) signature:
    arguments without a default count, those that default to None may be given, and
    others (``n_batch_axes=1``) are options; None where that cannot be told."""
    while isinstance(component, chainer.Sequential):
        if len(component) == 0:
            return None
        component = component[0]
    target = component.forward if isinstance(component, chainer.Link) else component
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return None
    low = high = 0
    for p in parameters:
        if p.kind is p.VAR_POSITIONAL:
            return (low, None) if low else None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if p.default is p.empty:
                low, high = low + 1, high + 1
            elif p.default is None:
                high += 1
    return low, high


def joint_arity(arities: Sequence[Arity]) -> Arity:
    """What every one of several input components takes (each gets every input)."""
    known = [a for a in arities if a is not None]
    if not known:
        return None
    low = max(a[0] for a in known)
    highs = [a[1] for a in known if a[1] is not None]
    return low, (min(highs) if highs else None)


class Needs(NamedTuple):
    """What one rank's stage takes from its own data."""

    inputs: bool  # a component takes the model's inputs
    arity: Arity  # how many input arrays (None: not known)
    labels: bool  # it computes the loss (a Classifier around it)


def _needs_text(needs: Needs) -> str:
    if needs.inputs:
        count = "" if needs.arity is None else _count(needs.arity) + " "
        if needs.labels:
            return (f"the inputs ({count}array{'s' if count != '1 ' else ''}) and then the "
                    "labels, e.g. chainer.datasets.TupleDataset(x, t)")
        return (f"the inputs only ({count}array{'s' if count != '1 ' else ''}), e.g. x or "
                "chainer.datasets.TupleDataset(x)")
    if needs.labels:
        return "the labels only, e.g. chainer.datasets.TupleDataset(t)"
    return "no data: mnpar.datasets.create_empty_dataset(dataset)"


def _count(arity: Tuple[int, Optional[int]]) -> str:
    low, high = arity
    if high == low:
        return str(low)
    return f"{low} or more" if high is None else f"{low} to {high}"


def _fits(needs: Needs, n: int) -> bool:
    given = n - needs.labels
    if not needs.inputs:
        return given == 0
    low, high = needs.arity if needs.arity is not None else (1, None)
    return given >= max(low, 1) and (high is None or given <= high)


def example_text(layout: Sequence[Tuple[Tuple[int, ...], str]]) -> str:
    return ", ".join(f"{shape} {dtype}" for shape, dtype in layout) or "nothing"


def check_layout(comm: Communicator, op: str, needs: Sequence[Needs], batch_size: int,
                 arrays: Any) -> None:
    """Raises ValueError on every rank unless every rank's data fits its stage; one
    allgather (the first step)."""
    if isinstance(arrays, dict):
        mine: Any = "a dict"
    else:
        mine = [(tuple(a.shape[1:]), str(a.dtype)) for a in arrays]
    views = comm.allgather_obj((batch_size, mine))
    problems = []
    sizes = [size for size, _ in views]
    if any(size != sizes[0] for size in sizes):
        problems.append(_by_value("mini-batches of", sizes, str) + " examples")
    for rank, ((_, layout), need) in enumerate(zip(views, needs)):
        if layout == "a dict":
            problems.append(f"rank {rank}'s converter returns a dict; the pipeline needs "
                            "arrays or a tuple of arrays")
        elif not _fits(need, len(layout)):
            problems.append(f"rank {rank} iterates examples of {len(layout)} "
                            f"array{'s' if len(layout) != 1 else ''} "
                            f"({example_text(layout)}), where its stage takes "
                            f"{_needs_text(need)}")
    if problems:
        expected = "; ".join(f"rank {r}: {_needs_text(n)}" for r, n in enumerate(needs))
        raise ValueError(f"{op}: the data does not fit the pipeline's stages: "
                         f"{'; '.join(problems)}. Every rank iterates a dataset of the same "
                         f"length with the same batch size: {expected}")
