"""Pipelined micro-batch training for MultiNodeChainList models.

Each mini-batch is cut into micro-batches that flow through the ranks by a
schedule (``'gpipe'``, ``'1f1b'``, or the zero-bubble ``'zb1'`` and ``'zb2'``,
whose backward runs as B and W apart) proven deadlock-free before it runs; one
update equals the update of the whole mini-batch without pipelining.
"""
from ._balance import balance_by_size, balance_by_time, solve
from ._batch_norm import DeferredBatchNormalization, commit_deferred, defer_batch_norm
from ._cost import CostModel, Group, Link, hosts_of
from ._graph import Edge, Graph
from ._runner import microbatch_sizes
from ._schedule import (
           SCHEDULES,
           Action,
           Plan,
           ScheduleError,
           generate,
           makespan,
           peak_activations,
           plan,
           simulate,
           table,
)
from ._split import PipelineWarning
from ._stages import build_stage
from ._statistics import Statistics
from ._updater import PipelineEvaluator, PipelineUpdater

__all__ = ["PipelineUpdater", "PipelineEvaluator", "build_stage", "balance_by_time",
           "balance_by_size", "solve", "Graph", "Edge", "Action", "ScheduleError",
           "SCHEDULES", "generate", "simulate", "plan", "table", "microbatch_sizes",
           "DeferredBatchNormalization", "commit_deferred", "defer_batch_norm", "Plan",
           "makespan", "peak_activations", "PipelineWarning", "CostModel", "Link",
           "Group", "hosts_of", "Statistics"]
