"""Sharded data parallelism: ZeRO's three stages around any chainer optimizer.

Plain data parallelism keeps the whole model state on every rank of the
data axis. A sharded optimizer keeps each rank's share of it instead, and
its updates equal plain data parallelism's (``docs/sharded.rst``)::

    stage  each rank keeps (float32 Adam,   one update
           bytes a parameter, N ranks)
    0      4 + 4 + 8                        allreduce gradients; update all
    1      4 + 4 + 8 / N                    allreduce gradients (the communicator's own
                                            strategy); update this rank's shard; allgather
    2      4 + 4 / N + 8 / N                reduce-scatter gradients into the shard; update
                                            it; allgather parameters
    3      4 / N + 4 / N + 8 / N            each link's parameters allgathered before its
           (and the links running)          forward and backward, its gradients
                                            reduce-scattered after its backward (``_gather``);
                                            update the shard

Every stage runs the wrapped optimizer's own update rules and hooks on the
shards, set up on a mirror of the model (``_shard_link``); only rules and
hooks that work element by element may run there (``_elementwise``).
Shards are balanced flat ranges (``_shards``), moved by ``_shard_collectives``.

Stages 1 and 2 build their groups at the first update, after lazily
initialized links have their parameters and rank 0's parameters have been
broadcast (as ``MultiNodeOptimizer`` does, and with its rule for a first
update whose gradients belong to other weights); stage 3 builds them at
``setup``, which therefore needs every parameter initialized.
"""
import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import chainer

from ..communicators._facade import Communicator, note_progress
from ._elementwise import check_optimizer
from ._groups import Group, group_params
from ._multi_node import MultiNodeOptimizer, layout_of
from ._shard_collectives import ShardCollectives
from ._shard_link import Mirror, attach, build_mirror, check_no_shared

STAGES = (1, 2, 3)


class ShardedOptimizer(MultiNodeOptimizer):
    """A multi-node optimizer that shards optimizer state (stage 1), gradients (2) and
    parameters (3) over the data axis.

    Create one with ``create_multi_node_optimizer(..., stage=k)``. ``target`` is
    the model; the wrapped optimizer's own target is the mirror of shards.
    """

    _own = MultiNodeOptimizer._own + ("stage", "reshard_after_forward", "_model", "_groups",
                                      "_mirror", "_views", "_collectives", "_gather")

    def __init__(self, actual_optimizer: chainer.Optimizer, communicator: Communicator,
                 stage: int, reshard_after_forward: bool = True) -> None:
        super().__init__(actual_optimizer, communicator, zero_fill=True)
        object.__setattr__(self, "stage", stage)
        object.__setattr__(self, "reshard_after_forward", bool(reshard_after_forward))
        object.__setattr__(self, "_model", None)
        object.__setattr__(self, "_groups", None)
        object.__setattr__(self, "_mirror", None)
        object.__setattr__(self, "_views", [])
        object.__setattr__(self, "_collectives", ShardCollectives(communicator))
        object.__setattr__(self, "_gather", None)

    @property
    def target(self) -> Any:
        """The model (``setup``'s link)."""
        return self._model

    @property
    def mirror(self) -> Optional[Mirror]:
        """The link of this rank's shards that the wrapped optimizer updates (None before
        the groups are built)."""
        return self._mirror

    @property
    def groups(self) -> List[Group]:
        return list(self._groups or ())

    def setup(self, link: chainer.Link) -> "ShardedOptimizer":
        """Sets the wrapper up on ``link``; stage 3 shards its parameters now (collective:
        rank 0's parameters are broadcast first). Returns this wrapper."""
        if not isinstance(link, chainer.Link):
            raise TypeError(f"setup needs a chainer.Link, not {type(link).__name__}")
        check_no_shared(link)
        self.actual_optimizer.setup(chainer.Link())  # hooks may be added before the mirror
        object.__setattr__(self, "_model", link)
        if self.stage == 3:
            missing = [n for n, p in sorted(link.namedparams()) if p.array is None]
            if missing:
                raise ValueError(
                    f"stage 3 shards the parameters at setup, but {missing[:3]} are not "
                    "initialized; give the links their input sizes (e.g. L.Linear(3, 4)) or "
                    "run one forward before setup")
            self._layout_changed(link)
            self.communicator.bcast_data(link)
            self._build(link)
        return self

    def update(self, lossfun: Optional[Callable[..., Any]] = None, *args: Any,
               **kwds: Any) -> None:
        """Computes gradients (if ``lossfun`` is given), reduces them to the shards,
        updates the shards and (stages 1, 2) gathers the parameters; collective."""
        model = self._model
        if model is None:
            raise RuntimeError("the sharded optimizer is not set up; call setup(model) first")
        if lossfun is not None:
            loss = lossfun(*args, **kwds)
            if getattr(self.actual_optimizer, "_use_cleargrads", True):
                model.cleargrads()
            else:
                model.zerograds()
            self._clear_grad_shards()
            loss.backward(loss_scale=self.actual_optimizer._loss_scale)
            del loss
        note_progress("update {} of its sharded optimizer", self.actual_optimizer.t + 1)
        if self._groups is None:
            applies = not self._layout_changed(model) or self._broadcast(model)
            self._build(model)
            if not applies:
                return
        self._check_unchanged(model)
        check_optimizer(self.actual_optimizer, [p.update_rule for p in self._mirror.params()])
        self._reduce(model)
        self.actual_optimizer.update()
        self._write_back()
        if self.stage == 3:
            self._gather.after_update()
        else:
            for g in self._groups:
                self._collectives.allgather(g.flat, g.layout)
        self._clear_grad_shards()

    def ensure_built(self) -> None:
        """Shards the model now if no update has (collective: rank 0's parameters are
        broadcast first); a checkpoint's load fills the shards."""
        if self._groups is None:
            self._layout_changed(self._model)
            self.communicator.bcast_data(self._model)
            self._build(self._model)

    def _build(self, model: chainer.Link) -> None:
        """Makes the groups, the mirror and (stage 3) the gathering; collective-free."""
        named = sorted(model.namedparams(), key=lambda item: item[0])
        missing = [n for n, p in named if p.array is None]
        if missing:
            raise ValueError(f"sharded optimizer: {missing[:3]} are not initialized at the "
                             "first update; every link must have run (or have its input size) "
                             "by then, as the parameters are sharded once")
        unit_of = _owners(model) if self.stage == 3 else None
        comm = self.communicator
        groups = [Group(names, params, comm.size, comm.rank, keep_whole=self.stage < 3,
                        grad_shard=self.stage > 1)
                  for _, names, params in group_params(named, unit_of)]
        shards: Dict[str, Any] = {}
        views: List[Tuple[Group, int, str]] = []
        for g in groups:
            for slot, name in enumerate(g.names):
                shards[name] = g.view(slot)
                views.append((g, slot, name))
        mirror = build_mirror(comm, model, shards)
        attach(self.actual_optimizer, mirror, model)
        object.__setattr__(self, "_groups", groups)
        object.__setattr__(self, "_mirror", mirror)
        object.__setattr__(self, "_views", [(g, slot, mirror.shard_of(g.params[slot]),
                                             shards[name]) for g, slot, name in views])
        self._use_grad_shards()
        if self.stage == 3:
            from ._gather import Gatherer

            object.__setattr__(self, "_gather", Gatherer(self, model, groups, unit_of or {}))

    def _use_grad_shards(self) -> None:
        for g, slot, shard, _ in self._views:
            if g.grad_shard is not None:
                shard.grad = g.grad_view(slot)

    def _check_unchanged(self, model: chainer.Link) -> None:
        if self.stage == 3:
            return
        if layout_of(model) != self._layout:
            raise ValueError("sharded optimizer: the model's parameters changed after the first "
                             "update (a link initialized later, or parameters added); the "
                             "shards were made once: initialize every link before it")
        moved = [n for g in self._groups for n in g.moved()]
        if moved:
            raise ValueError(f"sharded optimizer: the arrays of {moved[:3]} were replaced after "
                             "the first update (e.g. by to_device or an assignment); the shards "
                             "are views of the arrays they had: write into them instead "
                             "(param.array[...] = x), or set the optimizer up afresh")

    def _reduce(self, model: chainer.Link) -> None:
        """Makes every shard parameter's gradient the mean of its elements over the ranks."""
        loss_scale = self.actual_optimizer._loss_scale
        if self.stage == 1:
            self.communicator.multi_node_mean_grad(model, zero_fill=True)
            for g, slot, shard, _ in self._views:
                shard.grad = g.whole_grad_view(slot)
        elif self.stage == 2:
            for g in self._groups:
                self._collectives.reduce_scatter([p.grad for p in g.params], g.layout,
                                                 g.grad_shard)
                g.fresh = False
                for p in g.params:
                    p.grad = None
            self._use_grad_shards()
        else:
            self._gather.before_update()
            self._use_grad_shards()
        for g, slot, shard, _ in self._views:
            if self.stage < 3:
                loss_scale = g.params[slot]._loss_scale
            shard._loss_scale = loss_scale

    def _write_back(self) -> None:
        """Puts an update that replaced a shard's array (``use_fp32_update``'s cast, say)
        back into the shard's place in its group."""
        for _, _, shard, view in self._views:
            if shard.array is not view:
                view[...] = shard.array
                shard.array = view

    def _clear_grad_shards(self) -> None:
        """The next reduction starts the gradient shards afresh (stage 3: zeroed where no
        backward reaches them)."""
        for g in self._groups or ():
            g.fresh = True

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Stage 3: every link's parameters whole until the block ends (collective on entry):
        an evaluation or an export without a gather per link call. Other stages: nothing."""
        if self._gather is None:
            yield
            return
        with self._gather.all_gathered():
            yield

    def serialize(self, serializer: Any) -> None:
        """The wrapped optimizer's state (this rank's shards), and in stage 3 the parameter
        shards themselves: a per-rank snapshot of one layout."""
        self.actual_optimizer.serialize(serializer)
        if self.stage == 3 and self._mirror is not None:
            self._mirror.serialize(serializer["mnpar_shards"])

    def free(self) -> None:
        """Releases the stage 3 hooks and the NCCL communicator, if any."""
        if self._gather is not None:
            self._gather.free()
            object.__setattr__(self, "_gather", None)
        self._collectives.free()


def _owners(model: chainer.Link) -> Dict[int, chainer.Link]:
    """id of each parameter -> the link that holds it directly (stage 3's unit)."""
    owners: Dict[int, chainer.Link] = {}
    for _, link in model.namedlinks():
        for name in link._params:
            owners[id(link.__dict__[name])] = link
    return owners
