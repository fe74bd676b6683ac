"""Which ranks share a node: MPI's shared-memory split, or a simulated one.

The MPI library decides which ranks share a node: hydra from its host list,
Open MPI from the nodes its daemons (or Slurm's PMIx) report, MPICH under
``srun`` from Slurm's process mapping; ranks need not be in blocks (``srun -m
cyclic``). ``tests/cluster`` checks ``intra_rank``/``inter_rank`` under each
against the hosts the ranks really run on.

``MNPAR_RANKS_PER_NODE=k`` groups consecutive ranks in blocks of ``k`` as if
each block were a node, so multi-node paths (hierarchical reduction, inter
ranks) run and are tested on one machine.
"""
import os
from typing import NamedTuple, Optional

import numpy as np
from mpi4py import MPI

ENV_RANKS_PER_NODE = "MNPAR_RANKS_PER_NODE"


class Topology(NamedTuple):
    intra: MPI.Comm  # the ranks of this node
    leaders: Optional[MPI.Comm]  # rank 0 of every node; None on other ranks
    inter_rank: int  # this node's index
    inter_size: int  # number of nodes


def ranks_per_node_override() -> Optional[int]:
    value = os.environ.get(ENV_RANKS_PER_NODE)
    if not value:
        return None
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        raise ValueError(f"{ENV_RANKS_PER_NODE}={value!r} must be a positive integer")
    return k


def discover(comm: MPI.Comm) -> Topology:
    """Splits ``comm`` by node; collective over ``comm``."""
    k = ranks_per_node_override()
    if k is None:
        intra = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    else:
        intra = comm.Split(comm.rank // k, comm.rank)
    split = comm.Split(0 if intra.rank == 0 else MPI.UNDEFINED, comm.rank)
    leaders = None if split == MPI.COMM_NULL else split
    node = np.array([leaders.rank, leaders.size] if leaders is not None else [0, 0], np.int64)
    intra.Bcast(node, root=0)
    return Topology(intra, leaders, int(node[0]), int(node[1]))
