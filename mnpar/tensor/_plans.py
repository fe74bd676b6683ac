"""Ready plans for common shapes, read from a model's links.

Each function returns a plan (exact link paths to styles) for
``parallelize``; print it to see, or edit it before use.

==================  ==================================================================
plan                what it splits
==================  ==================================================================
``mlp_plan``        the ``L.Linear`` links in path order, by pairs: column, then row
                    (one allreduce forward and one backward a pair); an odd last one
                    stays whole
``transformer_      in every chain with ``query``, ``key``, ``value`` and ``out``
plan``              links: the first three by column and ``out`` by row, in whole
                    heads; ``fc1``/``fc2`` pairs column and row; ``L.EmbedID`` links
                    and the ``output`` layer by vocabulary. ``sequence=True``: each
                    a boundary of sequence parallelism along axis 1
``cnn_plan``        the convolutions in path order by pairs: output channels, then
                    input channels; then the ``L.Linear`` links as ``mlp_plan``
==================  ==================================================================
"""
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import chainer
import chainer.links as L

from ._errors import TensorParallelError
from ._styles import ChannelIn, ChannelOut, Column, Row, Style, Vocab

Plan = Dict[str, Style]


def _natural(path: str) -> List[Any]:
    """``/blocks/10/fc`` after ``/blocks/9/fc``: numbers compared as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]


def _links(model: chainer.Link, kinds: Tuple[type, ...]) -> List[Tuple[str, Any]]:
    found = [(p, link) for p, link in model.namedlinks(skipself=True) if type(link) in kinds]
    return sorted(found, key=lambda item: _natural(item[0]))


def _pairs(links: Sequence[Tuple[str, Any]], first: Style, second: Style) -> Plan:
    plan: Plan = {}
    for i in range(0, len(links) - 1, 2):
        plan[links[i][0]] = first
        plan[links[i + 1][0]] = second
    return plan


def mlp_plan(model: chainer.Link) -> Plan:
    """``L.Linear`` links in path order, by pairs (column, row); an odd last one whole.

    Example::

        mnpar.tensor.parallelize(model, mesh, mnpar.tensor.mlp_plan(model))
    """
    return _pairs(_links(model, (L.Linear,)), Column(), Row())


def cnn_plan(model: chainer.Link) -> Plan:
    """Convolutions in path order by pairs (output channels, then input channels), then the
    ``L.Linear`` links by pairs (column, row)."""
    plan = _pairs(_links(model, (L.Convolution2D, L.ConvolutionND, L.Convolution1D,
                                 L.Convolution3D)), ChannelOut(), ChannelIn())
    plan.update(mlp_plan(model))
    return plan


def _heads(chain: Any, path: str, heads: Optional[int]) -> int:
    found = heads if heads is not None else next(
        (getattr(chain, a) for a in ("heads", "n_heads", "num_heads") if hasattr(chain, a)),
        None)
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        raise TensorParallelError(f"transformer_plan: the attention {path!r} has no heads "
                                  "attribute (heads, n_heads or num_heads); give "
                                  "transformer_plan(model, heads=...)")
    return found


def transformer_plan(model: chainer.Link, heads: Optional[int] = None,
                     sequence: bool = False,
                     attention: Sequence[str] = ("query", "key", "value", "out"),
                     mlp: Sequence[str] = ("fc1", "fc2"), output: str = "output") -> Plan:
    """Megatron's split of a Transformer written with chainer's links.

    Args:
        model: the model (its paths name the plan's links).
        heads: attention heads (default: the attention chain's ``heads``,
            ``n_heads`` or ``num_heads``).
        sequence: sequence parallelism along axis 1 between the split layers.
        attention: the names of the query, key, value and output links of an
            attention chain.
        mlp: the names of the two links of a block's MLP.
        output: the name of the output layer (split by vocabulary).

    Raises:
        TensorParallelError: an attention chain without a head count, or whose
            width its heads do not divide.
    """
    axis = 1 if sequence else None
    plan: Plan = {}
    q, k, v, o = attention
    for path, chain in model.namedlinks():
        children = {name for name, _ in chain.namedlinks(skipself=True) if name.count("/") == 1}
        base = "" if path == "/" else path
        if {f"/{q}", f"/{k}", f"/{v}", f"/{o}"} <= children:
            n = _heads(chain, path, heads)
            width = getattr(chain, o).W.shape[1] if getattr(chain, o).W.array is not None \
                else getattr(chain, q).out_size
            if width % n:
                raise TensorParallelError(f"transformer_plan: the attention {path!r} has "
                                          f"{width} features, not a multiple of {n} heads")
            for name in (q, k, v):
                plan[f"{base}/{name}"] = Column(unit=width // n, sequence=axis)
            plan[f"{base}/{o}"] = Row(unit=width // n, sequence=axis)
        if {f"/{mlp[0]}", f"/{mlp[1]}"} <= children:
            plan[f"{base}/{mlp[0]}"] = Column(sequence=axis)
            plan[f"{base}/{mlp[1]}"] = Row(sequence=axis)
        if type(chain) is L.EmbedID or (type(chain) is L.Linear
                                        and path.rsplit("/", 1)[-1] == output):
            plan[path] = Vocab(sequence=axis)
    return plan
