"""How a plan splits a link: one style object per way, checked against the link's class.

=====================  ==============================  ===================================
style                  links                           what each rank holds
=====================  ==============================  ===================================
``Column``             ``L.Linear``                    its part of the output features
``Row``                ``L.Linear``                    its part of the input features
``Vocab``              ``L.EmbedID``; ``L.Linear``      its part of the vocabulary (rows of
                       (as ``Column``, for the loss)   the embedding, output features)
``ChannelOut``         ``L.Convolution2D``,            its part of the output channels
                       ``L.ConvolutionND`` (1D, 3D)
``ChannelIn``          the same                        its part of the input channels
``Channel``            ``L.BatchNormalization``        its part of the channels
``Replicate``          any                             the whole link (the default)
=====================  ==============================  ===================================

Strings name the styles with their defaults (``"column"``, ``"row"``,
``"vocab"``, ``"channel_out"``, ``"channel_in"``, ``"channel"``,
``"replicate"``). ``unit`` keeps whole units together (a head's features:
``Column(unit=head_size)``); ``sequence=axis`` makes the layer a boundary of
sequence parallelism (its input, or its output, a part of that axis).
"""
from typing import Any, Dict, List, Optional, Tuple

import chainer
import chainer.links as L

from ._conv import ChannelBatchNormalization, split_class
from ._embed import VocabEmbedID
from ._errors import TensorParallelError
from ._linear import ColumnLinear, RowLinear
from ._split_link import cut_problem, link_error


def _int(value: Any, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise TypeError(f"{what} must be an int of at least {least}, not {value!r}")
    return value


def _axis(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"sequence must be an axis (an int) or None, not {value!r}")
    return value


class Style:
    """A way to split a link (a row of the table above)."""

    name = ""
    links: Tuple[type, ...] = ()

    def _args(self) -> Dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._args().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: Any) -> bool:
        return type(self) is type(other) and self._args() == other._args()

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self._args().items()))))

    def check(self, link: chainer.Link, path: str, comm: Any) -> None:
        """Refuses a link this style does not split, or whose sizes ``comm`` cannot cut."""
        if type(link) not in self.links:
            names = " or ".join(f"chainer.links.{c.__name__}" for c in self.links)
            raise TensorParallelError(
                f"parallelize: the plan splits {path!r} {self!r}, which applies to {names}, "
                f"not {type(link).__module__}.{type(link).__name__}" + (
                    " (a subclass with its own forward: split its links instead)"
                    if any(isinstance(link, c) for c in self.links) else ""))
        for total, unit, what in self._cuts(link):
            problem = cut_problem(total, unit, comm.size, what) if total is not None else ""
            if problem:
                raise link_error(type(link), path, self, problem)
        if getattr(link, "groups", 1) != 1:
            raise link_error(type(link), path, self,
                             f"it is a grouped convolution (groups={link.groups})")

    def _cuts(self, link: Any) -> List[Tuple[Optional[int], int, str]]:
        """(whole extent or None, unit, what) of each axis the style cuts."""
        return []

    def apply(self, link: Any, comm: Any, path: str) -> None:
        raise NotImplementedError


class Column(Style):
    """``L.Linear`` by output features; ``gather_output``: its output whole again."""

    name = "column"
    links = (L.Linear,)

    def __init__(self, unit: int = 1, gather_output: bool = False,
                 sequence: Optional[int] = None) -> None:
        self.unit = _int(unit, "Column(unit=...)", 1)
        self.gather_output = bool(gather_output)
        self.sequence = _axis(sequence)

    def _args(self) -> Dict[str, Any]:
        return dict(unit=self.unit, gather_output=self.gather_output, sequence=self.sequence)

    def _cuts(self, link: Any) -> List[Tuple[Optional[int], int, str]]:
        return [(link.out_size, self.unit, "output features")]

    def apply(self, link: Any, comm: Any, path: str) -> None:
        _become(link, ColumnLinear, comm, path, self)
        link._tp_split(self.unit, self.gather_output, self.sequence)


class Row(Style):
    """``L.Linear`` by input features; its output summed over the group."""

    name = "row"
    links = (L.Linear,)

    def __init__(self, unit: int = 1, sequence: Optional[int] = None) -> None:
        self.unit = _int(unit, "Row(unit=...)", 1)
        self.sequence = _axis(sequence)

    def _args(self) -> Dict[str, Any]:
        return dict(unit=self.unit, sequence=self.sequence)

    def _cuts(self, link: Any) -> List[Tuple[Optional[int], int, str]]:
        whole = link.W.shape[1] if link.W.array is not None else link.in_size
        return [(whole, self.unit, "input features")]

    def apply(self, link: Any, comm: Any, path: str) -> None:
        _become(link, RowLinear, comm, path, self)
        link._tp_split(self.unit, self.sequence)


class Vocab(Style):
    """``L.EmbedID`` by vocabulary rows (output summed over the group, or reduce-scattered
    along ``sequence``); ``L.Linear`` as ``Column`` (scores cut by class, for the loss)."""

    name = "vocab"
    links = (L.EmbedID, L.Linear)

    def __init__(self, sequence: Optional[int] = None) -> None:
        self.sequence = _axis(sequence)

    def _args(self) -> Dict[str, Any]:
        return dict(sequence=self.sequence)

    def _cuts(self, link: Any) -> List[Tuple[Optional[int], int, str]]:
        if isinstance(link, L.Linear):
            return [(link.out_size, 1, "output features")]
        return [(link.W.shape[0], 1, "words")]

    def apply(self, link: Any, comm: Any, path: str) -> None:
        if isinstance(link, L.Linear):
            Column(sequence=self.sequence).apply(link, comm, path)
            link._tp_style = self
            return
        _become(link, VocabEmbedID, comm, path, self)
        link._tp_split(self.sequence)


class ChannelOut(Style):
    """Convolutions by output channels; ``gather_output``: the output whole again."""

    name = "channel_out"
    links = (L.Convolution2D, L.ConvolutionND, L.Convolution1D, L.Convolution3D)

    def __init__(self, gather_output: bool = False) -> None:
        self.gather_output = bool(gather_output)

    def _args(self) -> Dict[str, Any]:
        return dict(gather_output=self.gather_output)

    def _cuts(self, link: Any) -> List[Tuple[Optional[int], int, str]]:
        return [(link.out_channels, 1, "output channels")]

    def apply(self, link: Any, comm: Any, path: str) -> None:
        _become(link, split_class(type(link), "out"), comm, path, self)
        link._tp_split(self.gather_output)


class ChannelIn(Style):
    """Convolutions by input channels; the output summed over the group."""

    name = "channel_in"
    links = (L.Convolution2D, L.ConvolutionND, L.Convolution1D, L.Convolution3D)

    def _cuts(self, link: Any) -> List[Tuple[Optional[int], int, str]]:
        return [(link.W.shape[1] if link.W.array is not None else None, 1, "input channels")]

    def apply(self, link: Any, comm: Any, path: str) -> None:
        _become(link, split_class(type(link), "in"), comm, path, self)
        link._tp_split()


class Channel(Style):
    """``L.BatchNormalization`` by channels: parameters and statistics cut alike."""

    name = "channel"
    links = (L.BatchNormalization,)

    def check(self, link: Any, path: str, comm: Any) -> None:
        gamma: Any = getattr(link, "gamma", None)
        if isinstance(link, L.BatchNormalization) and (
                link.axis is not None or gamma is None or gamma.array is None
                or len(gamma.shape) != 1):
            raise link_error(type(link), path, self, "it needs its size given and the default "
                             "axis (a per-channel batch normalization)")
        super().check(link, path, comm)

    def _cuts(self, link: Any) -> List[Tuple[Optional[int], int, str]]:
        return [(link.gamma.shape[0], 1, "channels")]

    def apply(self, link: Any, comm: Any, path: str) -> None:
        _become(link, ChannelBatchNormalization, comm, path, self)
        link._tp_split()


class Replicate(Style):
    """The whole link on every rank (what a link the plan does not name gets)."""

    name = "replicate"
    links = (chainer.Link,)

    def check(self, link: chainer.Link, path: str, comm: Any) -> None:
        pass

    def apply(self, link: Any, comm: Any, path: str) -> None:
        pass


STYLES: Dict[str, Style] = {s.name: s for s in (
    Column(), Row(), Vocab(), ChannelOut(), ChannelIn(), Channel(), Replicate())}


def style_of(value: Any, pattern: str) -> Style:
    """A plan's value as a style: a ``Style``, or the name of one with its defaults."""
    if isinstance(value, Style):
        return value
    if isinstance(value, str) and value in STYLES:
        return STYLES[value]
    raise TypeError(f"parallelize: the plan maps {pattern!r} to {value!r}; a style is one of "
                    f"{', '.join(repr(n) for n in STYLES)} or a mnpar.tensor style object "
                    "(Column(unit=...), Row(...), Vocab(...)...)")


def _become(link: Any, cls: type, comm: Any, path: str, style: Style) -> None:
    plain = type(link)
    link.__class__ = cls
    link._tp_setup(comm, path, style, plain)
