"""Trainer extensions: per-rank atomic snapshots and a resume all ranks agree on;
ChainerMN's multi-node snapshot, checkpointer, evaluators, early stopping,
observation aggregator and persistent averaging."""
from ._allreduce_persistent import AllreducePersistent
from ._checkpointer import create_multi_node_checkpointer
from ._early_stopping import MultiNodeEarlyStoppingTrigger
from ._evaluator import create_multi_node_evaluator
from ._files import complete_iterations, parse_snapshot_filename, snapshot_filename
from ._generic_evaluator import GenericMultiNodeEvaluator
from ._multi_node_snapshot import multi_node_snapshot
from ._observation_aggregator import ObservationAggregator
from ._order_sampler import ResumableShuffleOrderSampler
from ._resume import find_common_snapshot, resume
from ._sharded_checkpoint import ShardedCheckpoint, checkpoint, resume_checkpoint
from ._snapshot import RankSnapshot, snapshot

__all__ = ["snapshot", "RankSnapshot", "resume", "find_common_snapshot", "snapshot_filename",
           "parse_snapshot_filename", "complete_iterations", "ResumableShuffleOrderSampler",
           "create_multi_node_evaluator", "multi_node_snapshot",
           "create_multi_node_checkpointer", "MultiNodeEarlyStoppingTrigger",
           "ObservationAggregator", "AllreducePersistent", "GenericMultiNodeEvaluator",
           "checkpoint", "resume_checkpoint", "ShardedCheckpoint"]
