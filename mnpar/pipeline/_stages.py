"""Stages without wiring by hand: a ``chainer.Sequential`` cut by a balance.

Every rank builds the same Sequential (same seed, same weights) and keeps
its own run of layers; ``balance[i]`` is the number of layers of rank i::

    loop=True  (the seed MLP's shape; data and loss on rank 0)
        rank 0: part 0 (None -> 1), output (last rank -> None)
        rank i: part i (i-1 -> i+1), the last one sends back to rank 0
    loop=False (a chain; the loss on the last rank)
        rank i: part i (i-1 or None -> i+1 or None)

With ``chunks=v`` the model is cut into ``v`` parts per rank, and rank i
holds parts i, i + n, i + 2n, ... of the n ranks (interleaved virtual
stages, as Megatron-LM has them): a micro-batch passes every rank v times,
so the pipeline's bubble shrinks to (n - 1) / (v m) of a step.

Every rank passes its own arguments; one allgather checks that they agree,
and that every rank built the same model (``_agreement``), before any rank
keeps its layers.

Each part is a ``Part`` (``_part``): a Sequential that passes values between
its layers, and takes them through the cut before it, exactly as the whole
Sequential does (a tuple is unpacked into the next layer's arguments), so a
model runs split only where it runs whole; the error of a model that does not
names the stage, the layer's index in the whole model and the cut.

``placement="v"`` with ``chunks=2`` puts the parts in a V instead (ZB-V's,
Qi et al. 2024): rank i holds parts i and 2n - 1 - i, so the micro-batch
goes down the ranks and back up, rank n - 1 runs two parts in a row (a
local edge) and the last part, the output and the loss are on rank 0::

    parts    0  1  2  3            (n = 2)
    rank     0  1  1  0
"""
from typing import Any, List, Sequence

import chainer

from ..communicators import Communicator
from ..links import MultiNodeChainList
from ._agreement import check_agree, fingerprint_digest, model_fingerprint
from ._part import Part

PLACEMENTS = ("interleaved", "v")  # part j on rank j % n; or a V: ranks 0 .. n-1 .. 0


def owner(part: int, size: int, placement: str) -> int:
    """The rank that holds part ``part`` of ``size`` ranks' parts by ``placement``."""
    if placement == "v":
        return part if part < size else 2 * size - 1 - part
    return part % size


class _Output(chainer.Chain):
    """Returns what the last rank sent back: the model's output."""

    def forward(self, y: Any) -> Any:
        return y


def check_balance(balance: Sequence[int], n_layers: int, size: int,
                  chunks: int = 1) -> List[int]:
    """``balance`` as a list if it gives every part at least one layer and sums to all."""
    balance = [int(b) for b in balance]
    if len(balance) != size * chunks:
        per = "one per rank" if chunks == 1 else f"{chunks} per rank ({chunks} chunks)"
        raise ValueError(f"balance={balance} has {len(balance)} parts for {size} ranks; give "
                         f"{per}")
    if any(b < 1 for b in balance):
        raise ValueError(f"balance={balance}: every part needs at least one layer")
    if sum(balance) != n_layers:
        raise ValueError(f"balance={balance} sums to {sum(balance)}, but the model has "
                         f"{n_layers} layers")
    return balance


def build_stage(model: chainer.Sequential, balance: Sequence[int], comm: Communicator,
                loop: bool = True, chunks: int = 1,
                placement: str = "interleaved") -> MultiNodeChainList:
    """This rank's part of ``model`` as a MultiNodeChainList.

    Args:
        model: the whole model, built alike on every rank.
        balance: layers per part, in order: one part per rank, or ``chunks``
            per rank (part j on rank j % size).
        comm: the mnpar communicator.
        loop: the output returns to rank 0 (which holds data and loss); else
            the last part's rank gives it.
        chunks: parts (virtual stages) per rank.
        placement: ``'interleaved'`` (part j on rank j % size) or ``'v'``
            (with ``chunks=2``: rank i holds parts i and 2 size - 1 - i; the
            last part is rank 0's, which then computes the loss whatever
            ``loop`` says).

    Returns:
        MultiNodeChainList: wrap it in ``chainer.links.Classifier`` on the
        rank that computes the loss (rank 0 with ``loop``, else the last).
        Its components are this rank's parts, each a ``chainer.Sequential``
        (an mnpar subclass) that runs its layers as the whole model does: a
        tuple a layer returns is unpacked into the next layer's arguments,
        on this rank or across a cut.

    Collective: every rank of ``comm`` calls it, with the same arguments.

    Raises:
        TypeError: ``model`` is not a ``chainer.Sequential``.
        ValueError: a balance that does not fit the model or the ranks, or a
            placement other than those of ``PLACEMENTS`` (``'v'`` needs 2 chunks);
            on every rank, ranks whose ``balance``, ``chunks``, ``loop``,
            ``placement`` or model (its layers' types and parameter shapes) differ.
        TypeError, or what a layer raises: at the first forward, on the rank
            that runs the layer, a model that the whole Sequential cannot run
            (a layer called with arguments it does not take; a list, or what
            is neither array nor Variable, returned at a cut); the error names
            the stage, the layer's index in the whole model and the cut, and
            fail-fast ends every rank within seconds. Nothing about the values
            is known before they flow, so ``build_stage`` itself cannot refuse it.

    Example::

        model = chainer.Sequential(L.Linear(64, 256), F.relu, L.Linear(256, 10))
        stage = mnpar.pipeline.build_stage(model, [2, 1], comm)
        if comm.rank == 0:
            stage = L.Classifier(stage)
    """
    if not isinstance(model, chainer.Sequential):
        raise TypeError(f"build_stage cuts a chainer.Sequential into stages, not "
                        f"{type(model).__name__}; put the layers in a chainer.Sequential")
    balance = list(balance)
    fingerprint = model_fingerprint(model)
    check_agree("build_stage", comm.allgather_obj(
        {"balance": balance, "chunks": chunks, "loop": loop, "placement": placement,
         "model": fingerprint}),
        "Every rank must build the same chainer.Sequential (same layers, same seed) and "
        "cut it with the same balance, chunks and loop, in the same placement")
    if not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks={chunks!r} must be an int of at least 1")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r} is not one of {PLACEMENTS}")
    if placement == "v" and chunks != 2:
        raise ValueError(f"placement='v' needs chunks=2 (rank i holds parts i and "
                         f"2 size - 1 - i), not chunks={chunks}")
    layers = list(model)
    balance = check_balance(balance, len(layers), comm.size, chunks)
    rank, size = comm.rank, comm.size
    starts = [sum(balance[:j]) for j in range(len(balance) + 1)]
    chain = MultiNodeChainList(comm)
    chain._mnpar_stage = (balance, chunks, loop, fingerprint_digest(fingerprint))
    chain._mnpar_placement = placement  # with the stage, how a snapshot names the split
    if size == 1:
        chain.add_link(Part(model, 0, len(layers), 0, 0, None, None), None, None)
        return chain
    last = len(balance) - 1
    owners = [owner(j, size, placement) for j in range(len(balance))]
    returns = loop and owners[last] != 0  # the output goes back to rank 0
    for j in (j for j in range(len(balance)) if owners[j] == rank):
        rank_in = None if j == 0 else owners[j - 1]
        rank_out = owners[j + 1] if j < last else (0 if returns else None)
        chain.add_link(Part(model, starts[j], starts[j + 1], rank, j, rank_in, rank_out),
                       rank_in, rank_out)
    if returns and rank == 0:
        chain.add_link(_Output(), owners[last], None)
    return chain
