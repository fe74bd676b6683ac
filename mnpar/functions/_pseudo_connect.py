"""``pseudo_connect``: attach a delegate variable to real outputs.

The outputs are the actual variables unchanged; the delegate becomes one
more input of the node, so ``backward()`` from the outputs also walks the
delegate's graph (a send or receive that the outputs do not depend on) —
after everything built on the outputs, as chainer goes from the highest node
down. The delegate gets a zero gradient of its own shape.
"""
from typing import Any, Tuple

import chainer

from .._arrays import get_array_module
from ._placeholder import as_variables, data_of, empty_like_device, spec_of


class PseudoConnect(chainer.FunctionNode):
    """Identity on inputs ``1..n``; input 0, the delegate, only joins the graph."""

    def forward(self, inputs):
        delegate = inputs[0]
        self._spec = spec_of(delegate)
        self._xp = get_array_module(delegate)
        return tuple(inputs[1:])

    def backward(self, indexes, grad_outputs):
        return as_variables((self._xp.zeros(*self._spec),)) + tuple(grad_outputs)


def pseudo_connect(delegate_variable: Any, *actual_variables: Any) -> Tuple[chainer.Variable, ...]:
    """Returns ``actual_variables`` connected to ``delegate_variable``.

    Args:
        delegate_variable: a delegate returned by ``send`` (or any variable
            whose graph must be walked in backward); None for none.
        *actual_variables: the variables (or arrays) to pass through.

    Returns:
        tuple of chainer.Variable: the actual variables, same data, now also
        depending on the delegate.

    Raises:
        ValueError: no actual variables were given.

    Example::

        phi = mnpar.functions.send(x, comm, rank=1)
        y, = mnpar.functions.pseudo_connect(phi, y)
    """
    if not actual_variables:
        raise ValueError("pseudo_connect needs at least one actual variable to connect "
                         "the delegate to")
    if delegate_variable is None:
        delegate_variable = empty_like_device(data_of(actual_variables[0]))
    return PseudoConnect().apply((delegate_variable,) + actual_variables)
