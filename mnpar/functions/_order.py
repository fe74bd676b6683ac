"""Backward runs a rank's communications in exactly the reverse of forward order.

Chainer's backward pops the highest-ranked node first, where a node's rank is
one more than its highest input's. Communication nodes that do not depend on
each other by data (a bcast on a non-root rank has only a phony input; two
sends of unrelated activations) would then run in an order set by graph
depth, which can differ from rank to rank: one rank enters a gather while its
peer enters a scatter, and both wait forever.

So each communication node is given a rank above the previous communication
node on the same communicator, *without* a graph edge between them (an edge
would keep old graphs alive and let backward wander into them). Raising a
node's rank never breaks chainer's ordering, since everything built on it is
created later and ranks above it. A forward that cannot deadlock then gives a
backward that cannot either: the same matches, in reverse.

    forward:   gather (rank 3)    bcast (rank 1 -> raised to 4)
    backward:  bcast first (4), then gather (3), on every rank
"""
import weakref
from typing import Any, Sequence

import chainer

from ..communicators._facade import Communicator

_previous: "weakref.WeakKeyDictionary[Any, weakref.ref]" = weakref.WeakKeyDictionary()


def after_previous(comm: Communicator, node: chainer.FunctionNode,
                   outputs: Sequence[chainer.Variable]) -> None:
    """Ranks ``node`` after the last communication node on ``comm`` that is still alive."""
    if not chainer.config.enable_backprop:
        return
    try:
        ref = _previous.get(comm)
        _previous[comm] = weakref.ref(node)
    except TypeError:  # a communicator that cannot be weakly referenced
        return
    prev = ref() if ref is not None else None
    if prev is not None and prev.rank >= node.rank:
        node.rank = prev.rank + 1
        for y in outputs:
            y.creator_node = node  # recomputes the output's rank
