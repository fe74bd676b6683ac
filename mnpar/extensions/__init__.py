"""Trainer extensions: per-rank atomic snapshots and a resume all ranks agree on;
the multi-node evaluator."""
from ._evaluator import create_multi_node_evaluator
from ._files import complete_iterations, parse_snapshot_filename, snapshot_filename
from ._order_sampler import ResumableShuffleOrderSampler
from ._resume import find_common_snapshot, resume
from ._snapshot import RankSnapshot, snapshot

__all__ = ["snapshot", "RankSnapshot", "resume", "find_common_snapshot", "snapshot_filename",
           "parse_snapshot_filename", "complete_iterations", "ResumableShuffleOrderSampler",
           "create_multi_node_evaluator"]
