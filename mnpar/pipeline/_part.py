"""One part of a ``chainer.Sequential`` that ``build_stage`` cut: it runs as the whole does.

``chainer.Sequential`` hands each layer's output to the next layer as its
arguments: a tuple is unpacked (``layer(*y)``), anything else is one argument.
A part does the same between its own layers and across the cut before it::

    whole:      L0 -> (y, s) -> L1(y, s) -> L2 ...
    cut after L0 (balance [1, 2]):
      part 0, rank 0:  L0 -> (y, s) ==== one message, flagged as a tuple ====+
      part 1, rank 1:  receives (y, s) as one argument, unpacks it: L1(y, s) <+

A part that does not start the model therefore takes exactly one argument,
what the part before it returned (a tuple crosses a cut as a tuple), where a
``MultiNodeChainList`` component receives one argument per rank of
``rank_in`` and passes a tuple on as it came. So a model runs split only if it
runs whole: a layer the whole Sequential calls with the wrong arguments fails
in the pipeline with the very exception (``TypeError: <lambda>() takes 1
positional argument but 2 were given``), never trains silently.

What cannot cross a cut as it is passed whole is refused where the part
returns it: a list (the whole passes it as one argument, a cut would deliver
it as a tuple, unpacked) and anything but arrays and Variables (a message
carries arrays).

Every layer is called by one method, ``_call_layer(index_in_whole, layer,
args)``; an exception raised in it carries a note (PEP 678; shown under the
traceback's last line, matched by ``pytest.raises(match=...)``) that names
the stage (rank and part), the layer's index in the whole model and the cut
its value came through, from which rank. What the whole Sequential cannot
run is known only when values flow, so the refusal comes at the first
forward, on the rank of the layer that fails; mnpar's fail-fast then ends
every rank within seconds, that error first.
"""
from typing import Any, Optional, Tuple

import chainer

from .._arrays import is_array
from ..random import _places


class Part(chainer.Sequential):
    """Layers ``start`` to ``stop - 1`` of ``whole``, run as ``whole`` runs them.

    Args:
        whole: the whole Sequential (kept as ``whole``, not registered as a child).
        start: the whole-model index of the part's first layer (``whole_start``).
        stop: one past the whole-model index of its last layer.
        rank: the rank that holds the part.
        index: the part's index among all parts (``build_stage``'s balance).
        source: the rank the part's input comes from; None where it takes the
            model's inputs (the part that starts the model).
        dest: the rank its output goes to; None where it stays here as the
            model's output.
    """

    def __init__(self, whole: chainer.Sequential, start: int, stop: int, rank: int, index: int,
                 source: Optional[int], dest: Optional[int]) -> None:
        super().__init__(*list(whole)[start:stop])
        self.whole = whole
        self.whole_start = start
        self.stage = (rank, index)
        self.source = source
        self.dest = dest
        _places.alias(self, whole)  # its random draws are named as the whole's layers

    def forward(self, *args: Any) -> Any:
        values = self._arguments(args)
        y: Any = None
        for i, layer in enumerate(self._layers):
            y = self._call_layer(self.whole_start + i, layer, values)
            values = y if isinstance(y, tuple) else (y,)
        if self.dest is not None:
            self._check_crossing(y)
        return y

    def _call_layer(self, index_in_whole: int, layer: Any, args: Tuple[Any, ...]) -> Any:
        """``layer(*args)``; an exception out of it gets a note naming where it ran."""
        try:
            return _places.call_layer(self, index_in_whole, layer, args)
        except Exception as e:
            if not any(note.startswith(_MARK) for note in getattr(e, "__notes__", ())):
                e.add_note(self._where(index_in_whole, layer, args))
            raise

    def _arguments(self, args: Tuple[Any, ...]) -> Tuple[Any, ...]:
        """The first layer's arguments: the model's inputs, or what came through the cut."""
        if self.source is None:
            return args
        if len(args) != 1:
            raise TypeError(f"{self._name()} takes the one value the part before it returned "
                            f"(from rank {self.source}), not {len(args)} arguments")
        value, = args
        return value if isinstance(value, tuple) else (value,)

    def _check_crossing(self, y: Any) -> None:
        """Refuses an output that a cut would not deliver as the whole passes it on."""
        last = self.whole_start + len(self) - 1
        where = (f"layer {last} ({layer_name(self._layers[-1])}) of the whole model, the last "
                 f"of {self._name()}, returns")
        cut = f"the cut after it to rank {self.dest}"
        if isinstance(y, list):
            raise TypeError(
                f"{where} a list, which chainer.Sequential passes to the next layer as one "
                f"argument, but {cut} carries it as a tuple, unpacked into arguments; return "
                f"a tuple (unpacked in both) or cut the model elsewhere")
        for i, item in enumerate(y if isinstance(y, tuple) else (y,)):
            if not (isinstance(item, chainer.Variable) or is_array(item)):
                at = f"[{i}]" if isinstance(y, tuple) else ""
                raise TypeError(f"{where} {type(item).__name__}{' in a tuple' * bool(at)} "
                                f"(item{at}), which cannot cross {cut}: a cut carries arrays "
                                f"and Variables, or a tuple of them")

    def _name(self) -> str:
        rank, index = self.stage
        last = self.whole_start + len(self) - 1
        layers = (f"layer {last}" if last == self.whole_start else
                  f"layers {self.whole_start} to {last}")
        return (f"the pipeline stage of rank {rank}, part {index} ({layers} of the whole "
                f"chainer.Sequential)")

    def _where(self, index: int, layer: Any, args: Tuple[Any, ...]) -> str:
        where = f"in {self._name()}, layer {index} ({layer_name(layer)})"
        if self.source is None:
            return f"{where}, called with the model's inputs" if index == 0 else where
        sender = (f"rank {self.source}" if self.source != self.stage[0] else
                  f"part {self.stage[1] - 1} on this rank")
        came = f"the cut after layer {self.whole_start - 1}, from {sender}"
        if index > self.whole_start:
            return f"{where}; the part's input came through {came}"
        if len(args) == 1:
            return f"{where}, called with {describe(args[0])} that came through {came}"
        return (f"{where}, called with the {len(args)} values of a tuple ("
                f"{', '.join(describe(a) for a in args)}) that came through {came}, unpacked "
                f"into its arguments as chainer.Sequential unpacks a tuple")


_MARK = "in the pipeline stage of"  # every note starts so; one note per exception


def layer_name(layer: Any) -> str:
    """A layer as a user wrote it: ``Linear``, ``relu``, ``<lambda>``."""
    if isinstance(layer, chainer.Link):
        return type(layer).__name__
    return getattr(layer, "__name__", type(layer).__name__)


def describe(value: Any) -> str:
    """``(4, 3) float64``, or the type of a value that is no array."""
    array: Any = value.array if isinstance(value, chainer.Variable) else value
    if is_array(array):
        return f"{tuple(array.shape)} {array.dtype}"
    return type(value).__name__
