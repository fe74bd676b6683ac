"""create_mnbn_model: a copy of a model whose batch normalizations span all ranks.

The model is deep-copied once (sharing the communicator, which cannot be
copied); then its tree of links is walked and each chainer
``BatchNormalization`` is replaced where it hangs, through chainer's own
API: a Chain's child by name, a ChainList's or Sequential's by index. The
user's model is never changed.
"""
import copy

import chainer
import chainer.links as L

from ..communicators._facade import Communicator, require_communicator
from ..functions._global_batch_norm import check_backend
from ._batch_normalization import MultiNodeBatchNormalization


def create_mnbn_model(link: chainer.Link, comm: Communicator,
                      communication_backend: str = "auto") -> chainer.Link:
    """A copy of ``link`` with every ``BatchNormalization`` made a ``MultiNodeBatchNormalization``.

    Each replacement carries the original's ``gamma``, ``beta``, running
    averages, ``N``, ``decay``, ``eps`` and dtype, on the original's device.
    ``BatchNormalization`` itself is replaced, at any depth of Chains,
    ChainLists and Sequentials; subclasses that normalize otherwise (e.g.
    ``BatchRenormalization``) are copied as they are. Set up the optimizer
    on the returned model.

    Args:
        link: a ``chainer.Link``: the model, or a single ``BatchNormalization``.
        comm: an mnpar communicator.
        communication_backend (str): ``'auto'``, ``'mpi'`` or ``'nccl'``, for
            every :class:`MultiNodeBatchNormalization` (see there).

    Returns:
        chainer.Link: the copy (a ``MultiNodeBatchNormalization`` where ``link``
        is a ``BatchNormalization``).

    Raises:
        TypeError: ``link`` is not a Link, or ``comm`` not an mnpar communicator.
        ValueError: a bad ``communication_backend``; a ``BatchNormalization``
            with no size yet (``size=None`` before its first call) or with an
            ``axis`` of its own.

    Example::

        model = mnpar.links.create_mnbn_model(ResNet50(), comm)
        optimizer = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)
        optimizer.setup(model)
    """
    require_communicator(comm, "create_mnbn_model")
    if not isinstance(link, chainer.Link):
        raise TypeError(f"create_mnbn_model needs a chainer.Link, not {type(link).__name__}")
    check_backend(comm, communication_backend)
    return _replace(copy.deepcopy(link, {id(comm): comm}), comm, communication_backend, "")


def _replace(link: chainer.Link, comm: Communicator, backend: str, path: str) -> chainer.Link:
    """``link`` with its batch normalizations replaced, in place (or the replacement)."""
    if type(link) is L.BatchNormalization:
        return _multi_node(link, comm, backend, path or "the top")
    if isinstance(link, chainer.ChainList):  # Sequential too; its layers include functions
        children = list(link.children())
        for i, layer in enumerate(list(link)):
            if isinstance(layer, chainer.Link):
                k = next(k for k, c in enumerate(children) if c is layer)
                new = _replace(layer, comm, backend, f"{path}/{k}")
                if new is not layer:
                    _set_child(link, i, k, new)
    elif isinstance(link, chainer.Chain):
        for name in sorted(link._children):
            child = getattr(link, name)
            new = _replace(child, comm, backend, f"{path}/{name}")
            if new is not child:
                delattr(link, name)
                link.add_link(name, new)
    return link


def _set_child(link: chainer.ChainList, i: int, k: int, new: chainer.Link) -> None:
    """Puts ``new`` at layer ``i`` (child ``k``) of a ChainList or Sequential.

    Not ``Sequential.__setitem__``: it re-inserts the link after the first
    link before it rather than the last, which renames the children's
    parameters (``/3/gamma`` becomes ``/1/gamma``) and breaks snapshots.
    """
    if isinstance(link, chainer.Sequential):
        link._layers[i] = new
    chainer.ChainList.__setitem__(link, k, new)


def _multi_node(bn: L.BatchNormalization, comm: Communicator, backend: str,
                path: str) -> MultiNodeBatchNormalization:
    if bn.avg_mean is None:
        raise ValueError(f"create_mnbn_model: the BatchNormalization at {path} has no size yet; "
                         "give it a size, or call the model once before converting it")
    if bn.axis is not None:
        raise ValueError(f"create_mnbn_model: the BatchNormalization at {path} has "
                         f"axis={bn.axis}; MultiNodeBatchNormalization normalizes over "
                         "chainer's default axes only (the batch and every axis after the "
                         "channels)")
    mnbn = MultiNodeBatchNormalization(
        bn.avg_mean.shape, comm, decay=bn.decay, eps=bn.eps, dtype=bn.avg_mean.dtype,
        use_gamma=bn.gamma is not None, use_beta=bn.beta is not None,
        communication_backend=backend)
    mnbn.to_device(bn.device)
    mnbn.copyparams(bn)  # gamma, beta and the persistent avg_mean, avg_var and N
    return mnbn
