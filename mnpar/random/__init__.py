"""Random numbers that do not depend on how a model is split.

chainer's random functions (dropout and the others) draw from NumPy's or
cupy's generator, one number after another: a pipeline stage, a tile or a
replica draws its own sequence, so a split model is never the model one
process trains. Inside ``mnpar.random.scope`` they draw instead from a
counter-based generator (Philox), each number a function of the seed, the
call's place in the model, the step and the element's index in the whole
array, so one process and every split draw the same numbers for the same
elements::

    with mnpar.random.scope(model, optimizer, seed=0):
        trainer.run()

``sharded`` is for split code (tensor shards): a draw inside it is the slice
of the whole array that the shard holds.
"""
from ._draws import NODES
from ._position import sharded
from ._scope import RandomWarning, active, scope

__all__ = ["scope", "sharded", "active", "RandomWarning", "NODES"]
