"""Collectives for tensor parallelism: each backward is its forward's conjugate.

``mnpar.functions``' collectives (``allreduce``, ``allgather``...) are
adjoint when every rank's loss is summed: each rank backpropagates its own
loss. In tensor parallelism every rank of the group holds the *same* loss,
computed alike on every rank from the layers' joined results; an allreduce
there would add the group's identical gradients and multiply them by the
group's size. These functions are adjoint under that rule instead: a value
every rank holds alike (*replicated*) has one gradient, the same on every
rank; a value split over the ranks (*parts* along an axis, or *partial sums*)
has its own gradient on each rank::

    function                   forward         backward        from -> to
    -------------------------  --------------  --------------  ---------------------------
    copy_to_group              identity        allreduce       replicated -> used apart
    reduce_from_group          allreduce       identity        partial sums -> replicated
    scatter_to_group           this rank's     allgather       replicated -> parts
                               part
    gather_from_group          allgather       this rank's     parts -> replicated
                                               part
    gather_to_group            allgather       reduce-scatter  parts -> used apart
    reduce_scatter_from_group  reduce-scatter  allgather       partial sums -> parts

("used apart": each rank computes something else from it, its own columns
of a weight, so each rank's gradient of it is a part of the whole one.)

Parts may be uneven (``bounds``): ``gather`` takes each rank's extent as it
comes; ``scatter`` and ``reduce_scatter`` cut by ``numpy.array_split``'s rule
unless given bounds. Every rank of the group must call each function in the
same order (they are collectives). Second-order gradients are not supported.
"""
from typing import Any, Callable, List, Optional, Sequence

import chainer

from .._arrays import get_array_module
from ..communicators._facade import Communicator, require_communicator
from . import _group_ops as ops
from ._group_ops import Bounds

# Callables told of every collective run: (node, operation, 'forward' or 'backward');
# a forward without a message is told too, with operation '' (the node's place is known).
observers: List[Callable[[Any, str, str], None]] = []


def notify(node: Any, comm: Communicator, collective: str, phase: str) -> None:
    """Tells the observers that ``node`` runs ``collective`` ('' for none) over ``comm``."""
    if comm.size > 1:
        for observe in list(observers):
            observe(node, collective, phase)


class _GroupNode(chainer.FunctionNode):
    """One input, one output, over ``comm``; ``axis`` and ``bounds`` where it cuts."""

    op = ""

    def __init__(self, comm: Communicator, axis: int = 0, bounds: Optional[Bounds] = None):
        self.comm = comm
        self.axis = axis
        self.bounds = bounds

    @property
    def label(self) -> str:
        return f"mnpar.functions.{self.op}"

    def _note(self, collective: str, phase: str) -> None:
        notify(self, self.comm, collective, phase)

    def _grad(self, grad_outputs: Sequence[Any]) -> Any:
        gy = grad_outputs[0]
        if gy is None:
            xp = get_array_module(self._x0)
            return xp.zeros(self._out_shape, self._x0.dtype)
        return gy.array

    def _keep(self, x: Any, y: Any) -> None:
        self._x0 = x[:0] if x.ndim else x  # device and dtype, without the data
        self._out_shape = y.shape
        self._specs = [(x.shape, x.dtype)]

    def _cut(self, extent: int) -> Bounds:
        if self.bounds is None:
            self.bounds = ops.balanced(extent, self.comm.size)
        elif self.bounds[-1] != extent or len(self.bounds) != self.comm.size + 1:
            raise ValueError(f"{self.label}: bounds {self.bounds} do not cut an axis of "
                             f"{extent} into {self.comm.size} parts")
        return self.bounds


def _sum_packed(comm: Communicator, arrays: Sequence[Any], what: str) -> List[Any]:
    """Each array summed over the group, in one allreduce per dtype."""
    if len(arrays) == 1:
        return [ops.sum_of(comm, arrays[0], what)]
    out: List[Any] = list(arrays)
    for dtype in sorted({str(a.dtype) for a in arrays}):
        which = [i for i, a in enumerate(arrays) if str(a.dtype) == dtype]
        xp = get_array_module(arrays[which[0]])
        flat = ops.sum_of(comm, xp.concatenate([arrays[i].ravel() for i in which]), what)
        offset = 0
        for i in which:
            n = arrays[i].size
            out[i] = flat[offset:offset + n].reshape(arrays[i].shape)
            offset += n
    return out


class CopyToGroup(_GroupNode):
    """The identity of any number of inputs; backward sums their gradients in one
    allreduce (per dtype)."""

    op = "copy_to_group"

    def forward(self, inputs):
        self._note("", "forward")
        self._keep(inputs[0], inputs[0])
        self._specs = [(a.shape, a.dtype) for a in inputs]
        return tuple(inputs)

    def backward(self, indexes, grad_outputs):
        self._note("allreduce", "backward")
        xp = get_array_module(self._x0)
        arrays = [xp.zeros(s, d) if g is None else g.array
                  for g, (s, d) in zip(grad_outputs, self._specs)]
        return tuple(chainer.Variable(a) for a in _sum_packed(self.comm, arrays, self.label))


class ReduceFromGroup(_GroupNode):
    op = "reduce_from_group"

    def forward(self, inputs):
        self._note("allreduce", "forward")
        y = ops.sum_of(self.comm, inputs[0], self.label)
        self._keep(inputs[0], y)
        return y,

    def backward(self, indexes, grad_outputs):
        return chainer.Variable(self._grad(grad_outputs)),


class _ToParts(_GroupNode):
    """A node whose output is parts along ``axis``: backward joins the parts' gradients
    (allgather); the forward says where the parts come from."""

    def backward(self, indexes, grad_outputs):
        self._note("allgather", "backward")
        gx, _ = ops.gather(self.comm, self._grad(grad_outputs), self.axis, self.label)
        return chainer.Variable(gx),


class _FromParts(_GroupNode):
    """A node whose input is parts along ``axis``: forward joins them (allgather) and keeps
    every rank's bounds; the backward says what each rank's gradient is."""

    def forward(self, inputs):
        self._note("allgather", "forward")
        y, self.bounds = ops.gather(self.comm, inputs[0], self.axis, self.label)
        self._keep(inputs[0], y)
        return y,


class ScatterToGroup(_ToParts):
    op = "scatter_to_group"

    def forward(self, inputs):
        self._note("", "forward")
        x = inputs[0]
        y = ops.part(x, self.axis, self._cut(x.shape[self.axis]), self.comm.rank)
        self._keep(x, y)
        return y,


class GatherFromGroup(_FromParts):
    op = "gather_from_group"

    def backward(self, indexes, grad_outputs):
        assert self.bounds is not None
        gy = self._grad(grad_outputs)
        return chainer.Variable(ops.part(gy, self.axis, self.bounds, self.comm.rank)),


class GatherToGroup(_FromParts):
    op = "gather_to_group"

    def backward(self, indexes, grad_outputs):
        assert self.bounds is not None
        self._note("reduce_scatter", "backward")
        gx = ops.reduce_scatter(self.comm, self._grad(grad_outputs), self.axis, self.bounds,
                                self.comm.rank, self.label)
        return chainer.Variable(gx),


class ReduceScatterFromGroup(_ToParts):
    op = "reduce_scatter_from_group"

    def forward(self, inputs):
        x = inputs[0]
        bounds = self._cut(x.shape[self.axis])
        self._note("reduce_scatter", "forward")
        y = ops.reduce_scatter(self.comm, x, self.axis, bounds, self.comm.rank, self.label)
        self._keep(x, y)
        return y,


def _variable_or_array(x: Any, op: str) -> None:
    if not isinstance(x, chainer.Variable) and not hasattr(x, "dtype"):
        raise TypeError(f"mnpar.functions.{op}: x must be a Variable or an array, not "
                        f"{type(x).__name__}")


def _axis(x: Any, axis: Any, op: str) -> int:
    ndim = len(x.shape)
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"mnpar.functions.{op}: axis must be an int, not {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"mnpar.functions.{op}: axis {axis} is out of range for an array of "
                         f"{ndim} axes (shape {tuple(x.shape)})")
    return axis % ndim


def _bounds(comm: Communicator, bounds: Any, extent: int, op: str) -> Optional[Bounds]:
    if bounds is None:
        if extent < comm.size:
            raise ValueError(f"mnpar.functions.{op}: an axis of {extent} cannot be cut into "
                             f"{comm.size} parts of at least one each")
        return None
    cut = tuple(int(b) for b in bounds)
    if (len(cut) != comm.size + 1 or cut[0] != 0 or cut[-1] != extent
            or any(b > c for b, c in zip(cut, cut[1:]))):
        raise ValueError(f"mnpar.functions.{op}: bounds {tuple(bounds)} must rise from 0 to "
                         f"the axis' extent {extent} in {comm.size + 1} steps (rank r's part "
                         "is bounds[r]:bounds[r + 1])")
    return cut


def _apply(node: _GroupNode, x: Any) -> chainer.Variable:
    return node.apply((x,))[0]


def copy_to_group(comm: Communicator, x: Any) -> chainer.Variable:
    """``x`` as it is; backward sums the gradients of the group (allreduce).

    Use it where a value every rank holds alike enters computations that
    differ from rank to rank (this rank's columns of a weight): each rank's
    gradient of it is a part of the whole gradient. A value that needs no
    gradient passes through untouched.
    """
    require_communicator(comm, "mnpar.functions.copy_to_group")
    _variable_or_array(x, "copy_to_group")
    if not (isinstance(x, chainer.Variable) and x.requires_grad):
        return chainer.as_variable(x)
    return _apply(CopyToGroup(comm), x)


def reduce_from_group(comm: Communicator, x: Any) -> chainer.Variable:
    """The sum of every rank's ``x`` (allreduce); backward passes the gradient as it is.

    Use it where each rank holds a partial sum (this rank's rows of a weight
    times its part of the input) and what follows is the same on every rank.
    """
    require_communicator(comm, "mnpar.functions.reduce_from_group")
    _variable_or_array(x, "reduce_from_group")
    return _apply(ReduceFromGroup(comm), x)


def scatter_to_group(comm: Communicator, x: Any, axis: int = -1,
                     bounds: Optional[Sequence[int]] = None) -> chainer.Variable:
    """This rank's part of ``x`` along ``axis``; backward joins the parts' gradients
    (allgather).

    Args:
        comm: the group's communicator.
        x: a value every rank holds alike.
        axis: the axis to cut.
        bounds: ``comm.size + 1`` rising offsets, rank r's part ``bounds[r]:bounds[r + 1]``
            (default: ``numpy.array_split``'s rule, the first parts one longer).
    """
    require_communicator(comm, "mnpar.functions.scatter_to_group")
    _variable_or_array(x, "scatter_to_group")
    a = _axis(x, axis, "scatter_to_group")
    cut = _bounds(comm, bounds, x.shape[a], "scatter_to_group")
    return _apply(ScatterToGroup(comm, a, cut), x)


def gather_from_group(comm: Communicator, x: Any, axis: int = -1) -> chainer.Variable:
    """Every rank's part joined along ``axis`` (allgather); backward keeps this rank's
    part of the gradient.

    Use it to leave a split region when what follows is the same on every
    rank. The parts may differ in extent along ``axis``; the other axes must agree.
    """
    require_communicator(comm, "mnpar.functions.gather_from_group")
    _variable_or_array(x, "gather_from_group")
    return _apply(GatherFromGroup(comm, _axis(x, axis, "gather_from_group")), x)


def gather_to_group(comm: Communicator, x: Any, axis: int = -1) -> chainer.Variable:
    """Every rank's part joined along ``axis`` (allgather); backward sums the gradients
    and keeps this rank's part (reduce-scatter).

    Use it where parts (a sequence cut over the ranks) enter computations
    that differ from rank to rank (sequence parallelism before a column-split
    layer): ``copy_to_group(gather_from_group(x))`` in one collective each way.
    """
    require_communicator(comm, "mnpar.functions.gather_to_group")
    _variable_or_array(x, "gather_to_group")
    return _apply(GatherToGroup(comm, _axis(x, axis, "gather_to_group")), x)


def reduce_scatter_from_group(comm: Communicator, x: Any, axis: int = -1,
                              bounds: Optional[Sequence[int]] = None) -> chainer.Variable:
    """This rank's part along ``axis`` of the sum of every rank's ``x`` (reduce-scatter);
    backward joins the parts' gradients (allgather).

    Use it where partial sums leave a split region into one cut along
    ``axis`` (sequence parallelism after a row-split layer):
    ``scatter_to_group(reduce_from_group(x))`` in one collective each way.
    """
    require_communicator(comm, "mnpar.functions.reduce_scatter_from_group")
    _variable_or_array(x, "reduce_scatter_from_group")
    a = _axis(x, axis, "reduce_scatter_from_group")
    cut = _bounds(comm, bounds, x.shape[a], "reduce_scatter_from_group")
    return _apply(ReduceScatterFromGroup(comm, a, cut), x)
