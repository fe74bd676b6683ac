"""Differentiable collectives; each backward is the adjoint of its forward.

======================  ==========================================
forward                 backward
======================  ==========================================
bcast from root         gradients summed to the root (gather + sum)
gather to root          root's gradients scattered back
scatter from root       gradients gathered to the root
allgather               all-to-all of the gradients, then a sum
alltoall                all-to-all of the gradients
allreduce (sum)         allreduce (sum) of the gradients
======================  ==========================================

Every node takes one extra phony input that requires a gradient, on every
rank, so that each rank joins the backward collective even where its real
inputs need no gradient (or, off the root, where it has none). A missing
output gradient travels as zeros, so peers never wait for it.
"""
from typing import Any, Sequence

import chainer

from .._arrays import get_array_module
from ..communicators._facade import Communicator, require_communicator
from ._order import after_previous
from ._placeholder import as_variables, data_of, empty_like_device, fill_missing, phony, spec_of


def _root(comm: Communicator, root: Any) -> int:
    require_communicator(comm, "mnpar.functions' collectives")
    return comm.check_peer(root, "root", allow_self=True)


class _Collective(chainer.FunctionNode):
    """Holds the communicator and the array module; the last input is phony."""

    def __init__(self, comm: Communicator, root: int = 0) -> None:
        require_communicator(comm, "mnpar.functions' collectives")
        self.comm = comm
        self.root = root

    @property
    def is_root(self) -> bool:
        return self.comm.rank == self.root

    def _remember(self, inputs, outputs) -> None:
        """Keeps the outputs' shapes and device, for zeros where a gradient is missing."""
        self._xp = get_array_module(outputs[0] if len(outputs) else inputs[0])
        self._out_specs = [spec_of(y) for y in outputs]

    def _grads(self, gxs: Sequence[Any]):
        """Variables of the data inputs' gradients, and None for the phony input."""
        return as_variables(gxs) + (None,)


class Bcast(_Collective):
    def forward(self, inputs):
        y = self.comm.bcast(inputs[0] if self.is_root else None, self.root)
        self._remember(inputs, (y,))
        return y,

    def backward(self, indexes, grad_outputs):
        gy, = fill_missing(grad_outputs, self._out_specs, self._xp)
        gys = self.comm.gather(gy, self.root)
        if gys is None:  # not the root
            return None,
        gx = gys[0].copy()
        for g in gys[1:]:
            gx += g
        return self._grads((gx,))


class Gather(_Collective):
    def forward(self, inputs):
        x = inputs[0]
        ys = self.comm.gather(x, self.root)
        outputs = ys if self.is_root else (empty_like_device(x),)
        self._remember(inputs, outputs)
        return outputs

    def backward(self, indexes, grad_outputs):
        gys = fill_missing(grad_outputs, self._out_specs, self._xp) if self.is_root else None
        gx = self.comm.scatter(gys, self.root)
        return self._grads((gx,))


class Scatter(_Collective):
    def forward(self, inputs):
        xs = tuple(inputs[:-1]) if self.is_root else None
        y = self.comm.scatter(xs, self.root)
        self._remember(inputs, (y,))
        return y,

    def backward(self, indexes, grad_outputs):
        gy, = fill_missing(grad_outputs, self._out_specs, self._xp)
        gxs = self.comm.gather(gy, self.root)
        if gxs is None:  # not the root
            return None,
        return self._grads(gxs)


class AllGather(_Collective):
    def forward(self, inputs):
        ys = self.comm.allgather(inputs[0])
        self._remember(inputs, ys)
        return ys

    def backward(self, indexes, grad_outputs):
        gys = fill_missing(grad_outputs, self._out_specs, self._xp)
        parts = self.comm.alltoall(tuple(gys))
        gx = parts[0].copy()
        for g in parts[1:]:
            gx += g
        return self._grads((gx,))


class AllToAll(_Collective):
    def forward(self, inputs):
        ys = self.comm.alltoall(tuple(inputs[:-1]))
        self._remember(inputs, ys)
        return ys

    def backward(self, indexes, grad_outputs):
        gys = fill_missing(grad_outputs, self._out_specs, self._xp)
        return self._grads(self.comm.alltoall(tuple(gys)))


class AllReduce(_Collective):
    def forward(self, inputs):
        y = self.comm.allreduce(inputs[0])
        self._remember(inputs, (y,))
        return y,

    def backward(self, indexes, grad_outputs):
        gy, = fill_missing(grad_outputs, self._out_specs, self._xp)
        return self._grads((self.comm.allreduce(gy),))


def _run(node: _Collective, *xs: Any) -> tuple:
    """Applies ``node`` to ``xs`` and a phony input; orders it after the last one."""
    outputs = node.apply(xs + (phony(data_of(xs[0]) if xs else None),))
    after_previous(node.comm, node, outputs)
    return outputs


def _check_variable(x: Any, what: str) -> None:
    if not isinstance(x, chainer.Variable) and not hasattr(x, "dtype"):
        raise TypeError(f"{what} must be a Variable or an array, not {type(x).__name__}")


def _parts(comm: Communicator, xs: Any, what: str) -> tuple:
    """``xs`` as a tuple of ``comm.size`` parts; an array or Variable is split on axis 0."""
    if isinstance(xs, (tuple, list)):
        parts = tuple(xs)
    elif isinstance(xs, chainer.Variable) or hasattr(xs, "shape"):
        if len(xs) != comm.size:
            raise ValueError(f"{what} has {len(xs)} rows along axis 0; {what} needs one per "
                             f"rank ({comm.size})")
        parts = chainer.functions.separate(xs, axis=0)
        parts = parts if isinstance(parts, tuple) else (parts,)
    else:
        raise TypeError(f"{what} must be a tuple/list of Variables or arrays, not "
                        f"{type(xs).__name__}")
    if len(parts) != comm.size:
        raise ValueError(f"{what} needs one part per rank: got {len(parts)} for a communicator "
                         f"of size {comm.size}")
    for i, p in enumerate(parts):
        _check_variable(p, f"{what}[{i}]")
    return parts


def bcast(comm: Communicator, x: Any = None, root: int = 0) -> chainer.Variable:
    """Broadcasts ``x`` from ``root``; backward sums every rank's gradient on the root.

    Args:
        comm: an mnpar communicator.
        x: the Variable or array to broadcast (used on ``root`` only; may be
            None elsewhere).
        root: the broadcasting rank.

    Returns:
        chainer.Variable: ``root``'s ``x`` on every rank.
    """
    root = _root(comm, root)
    if comm.rank == root:
        _check_variable(x, "x")
        return _run(Bcast(comm, root), x)[0]
    return _run(Bcast(comm, root))[0]


def gather(comm: Communicator, x: Any, root: int = 0) -> Any:
    """Gathers every rank's ``x`` on ``root``; backward scatters the gradients back.

    Returns:
        On ``root``, a tuple of ``comm.size`` Variables in rank order;
        elsewhere an empty delegate variable to backprop from (or to pass to
        ``pseudo_connect``).
    """
    root = _root(comm, root)
    _check_variable(x, "x")
    ys = _run(Gather(comm, root), x)
    return ys if comm.rank == root else ys[0]


def scatter(comm: Communicator, xs: Any = None, root: int = 0) -> chainer.Variable:
    """Sends ``xs[i]`` from ``root`` to rank ``i``; backward gathers the gradients.

    Args:
        comm: an mnpar communicator.
        xs: on ``root``, a tuple/list of ``comm.size`` Variables or arrays (or
            one whose first axis has that length); ignored elsewhere.
        root: the scattering rank.

    Returns:
        chainer.Variable: this rank's part.
    """
    root = _root(comm, root)
    if comm.rank == root:
        return _run(Scatter(comm, root), *_parts(comm, xs, "xs"))[0]
    return _run(Scatter(comm, root))[0]


def allgather(comm: Communicator, x: Any) -> tuple:
    """Every rank's ``x`` on every rank, as a tuple of Variables in rank order.

    Backward sends each gradient to the rank its value came from and sums.
    """
    _check_variable(x, "x")
    return _run(AllGather(comm), x)


def alltoall(comm: Communicator, xs: Any) -> tuple:
    """Sends ``xs[j]`` to rank ``j``; returns the parts every rank sent here.

    Args:
        comm: an mnpar communicator.
        xs: a tuple/list of ``comm.size`` Variables or arrays.

    Returns:
        tuple of chainer.Variable: element ``i`` came from rank ``i``.
    """
    return _run(AllToAll(comm), *_parts(comm, xs, "xs"))


def allreduce(comm: Communicator, x: Any) -> chainer.Variable:
    """The sum of every rank's ``x``, on every rank; backward is an allreduce too."""
    _check_variable(x, "x")
    return _run(AllReduce(comm), x)[0]
