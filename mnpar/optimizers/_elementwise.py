"""What may run on a shard: update rules and hooks that work element by element.

A sharded optimizer runs the wrapped optimizer's update rules and hooks on
this rank's shard of every parameter. That computes what the whole
parameter's update computes only where each element's new value depends on
that element alone (and on the step and the hyperparameters):

==================================================  ==========================================
update rules and hooks                              on a shard
==================================================  ==========================================
every update rule of ``chainer.optimizers``          exact: elementwise (Adam's bias correction
(Adam, AdamW, AMSGrad, AdaBound, SGD, MomentumSGD,   uses the rule's step count ``t``, which
AdaGrad, AdaDelta, RMSprop, RMSpropGraves, ...)      every rank keeps for every parameter)
``WeightDecay``, ``Lasso``, ``GradientHardClipping``  exact: elementwise
``mnpar.optimizer_hooks.GradientClipping``           exact: the norm summed over the shards
                                                     (a hook whose class says
                                                     ``mnpar_shard_aware = True``)
chainer's ``GradientClipping``                       refused: it clips by this rank's shard's norm
``GradientLARS``                                     refused: it scales by each parameter's norm
``GradientNoise``                                    refused: it draws its noise per shard
anything else                                        refused, unless its class says
                                                     ``mnpar_elementwise = True``
==================================================  ==========================================

A refusal is a ``ValueError`` at the update, naming the rule or hook and
what to use instead; it is the same on every rank, as every rank holds the
same optimizer.
"""
from typing import Any, Dict, Iterable

import chainer
import chainer.optimizer_hooks as hooks

_RULE_MODULE = "chainer.optimizers."
_ELEMENTWISE_HOOKS = (hooks.WeightDecay, hooks.Lasso, hooks.GradientHardClipping)
_REFUSED: Dict[type, str] = {
    hooks.GradientClipping: "it clips by the norm of this rank's shard, not the whole "
                            "model's; use mnpar.optimizer_hooks.GradientClipping(comm, "
                            "threshold), which sums the squares over the shards",
    hooks.GradientLARS: "it scales each parameter by that parameter's norms, which a shard "
                        "does not hold",
    hooks.GradientNoise: "it draws its noise per shard, not as one process draws it for the "
                         "whole parameter",
}


def elementwise_rule(rule: Any) -> bool:
    """Whether ``rule`` (an update rule) works element by element."""
    cls = type(rule)
    return (getattr(cls, "mnpar_elementwise", False)
            or (cls.__module__.startswith(_RULE_MODULE)
                and isinstance(rule, chainer.optimizer.UpdateRule)))


def check_hook(hook: Any, where: str, name: str = "") -> None:
    """Raises ``ValueError`` unless ``hook`` (registered as ``name``) may run on shards."""
    for cls, why in _REFUSED.items():
        if type(hook) is cls:
            raise ValueError(f"sharded optimizer: {where} {type(hook).__name__} cannot run on "
                             f"shards: {why}")
    if (isinstance(hook, _ELEMENTWISE_HOOKS) or getattr(hook, "mnpar_elementwise", False)
            or getattr(hook, "mnpar_shard_aware", False)):
        return
    name = name or getattr(hook, "name", None) or type(hook).__name__
    raise ValueError(
        f"sharded optimizer: {where} {name!r} ({type(hook).__name__}) is not known to work "
        "element by element, so it may not compute on this rank's shard what it computes on "
        "the whole parameter; give its class mnpar_elementwise = True if each element's "
        "result depends on that element alone, or use stage 0 (plain data parallelism)")


def _hooks_of(hookable: Any) -> Iterable[Any]:
    """``(name, hook)`` of every hook a chainer hookable holds."""
    if hookable is None:
        return ()
    return (list(hookable._pre_update_hooks.items())
            + list(hookable._post_update_hooks.items()))


def check_optimizer(optimizer: Any, rules: Iterable[Any]) -> None:
    """Raises ``ValueError`` for a hook of ``optimizer`` or a rule (or its hook) of ``rules``
    that may not run on shards, or for dynamic loss scaling (each shard's overflow check
    would decide alone)."""
    if getattr(optimizer, "_loss_scaling_is_dynamic", False):
        raise ValueError("sharded optimizer: dynamic loss scaling decides from this rank's "
                         "shard whether to skip a step, so ranks could decide apart; use a "
                         "fixed loss scale (optimizer.loss_scaling(scale=...))")
    for name, hook in _hooks_of(getattr(optimizer, "_hookable", None)):
        check_hook(hook, "optimizer hook", name)
    seen = set()
    for rule in rules:
        if type(rule) not in seen:
            seen.add(type(rule))
            if not elementwise_rule(rule):
                raise ValueError(
                    f"sharded optimizer: update rule {type(rule).__name__} is not one of "
                    "chainer.optimizers' (which work element by element); give its class "
                    "mnpar_elementwise = True if each element's update depends on that "
                    "element alone, or use stage 0 (plain data parallelism)")
        for name, hook in _hooks_of(getattr(rule, "_hookable", None)):
            check_hook(hook, "update rule hook", name)
