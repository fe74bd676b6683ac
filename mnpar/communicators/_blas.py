"""One BLAS thread per core per node.

With several ranks on one node, a BLAS that starts a thread per core in each
rank oversubscribes the cores and slows every rank down. Unless the user set
one of the usual thread variables, each rank gets its share of the cores.
Under Slurm with ``--cpus-per-task`` (``SLURM_CPUS_PER_TASK``), the share is
the cores Slurm gave the task: its affinity may already be the task's own.
"""
import os
from typing import Any, Optional

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS")
_limits: Optional[Any] = None  # the active limit; kept for the life of the process


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def threads_for(ranks_on_node: int) -> int:
    """This rank's BLAS threads: Slurm's cores per task, else its share of the node's."""
    per_task = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if per_task.isdigit() and int(per_task) > 0:
        return int(per_task)
    return max(1, cores() // max(1, ranks_on_node))


def limit_blas_threads(ranks_on_node: int) -> Optional[int]:
    """Limits this rank's BLAS threads to its share of the node's cores (``threads_for``).

    Returns the limit applied, or None where the user chose the thread count.
    """
    global _limits
    if any(os.environ.get(v) for v in THREAD_VARIABLES):
        return None
    from threadpoolctl import threadpool_limits

    share = threads_for(ranks_on_node)
    _limits = threadpool_limits(limits=share, user_api="blas")
    return share
