"""One rank of test_cluster_communicators: topology and gradient means across hosts.

Each rank fills float64 gradients from its own seed and lets the ``naive``,
``flat`` and ``hierarchical`` communicators average them; every rank computes
the mean of all ranks' gradients itself (a single process's sum, in rank
order) and compares. ``comm.allreduce`` is checked the same way. A mismatch
raises, which ends the job. Last, each rank prints one line
``RESULT {json}``: its address on the test network (its host, as the kernel
sees it) and the topology each communicator reported, which the test compares
with the hosts' layout.
"""
import os
import socket

import chainer
import numpy as np
from _report import report

import mnpar

NAMES = ("naive", "flat", "hierarchical")
# One tiny, one past MPI's eager limit, one past the shared buffer's chunk (64 Ki elements).
SHAPES = [(3,), (70, 50), (300, 400)]


def my_address() -> str:
    """This rank's source address towards the bridge (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.77.0.1", 9))
        return s.getsockname()[0]


def gradients(rank: int):
    rng = np.random.RandomState(100 + rank)
    return [rng.standard_normal(shape) for shape in SHAPES]


def model_with(grads) -> chainer.Link:
    link = chainer.Link()
    with link.init_scope():
        for i, g in enumerate(grads):
            setattr(link, f"p{i}", chainer.Parameter(np.zeros_like(g)))
            getattr(link, f"p{i}").grad = g.copy()
    return link


def main() -> None:
    assert "MNPAR_RANKS_PER_NODE" not in os.environ, "the nodes must be real, not simulated"
    topology = {}
    for name in NAMES:
        comm = mnpar.create_communicator(name, timeout=30)
        size, rank = comm.size, comm.rank
        everyone = [gradients(r) for r in range(size)]
        mean = [sum(g[i] for g in everyone) / size for i in range(len(SHAPES))]
        model = model_with(everyone[rank])
        comm.multi_node_mean_grad(model)
        for i, expected in enumerate(mean):
            np.testing.assert_allclose(getattr(model, f"p{i}").grad, expected,
                                       rtol=1e-12, atol=1e-14, err_msg=f"{name} p{i}")
        total = comm.allreduce(everyone[rank][2])
        np.testing.assert_allclose(total, mean[2] * size, rtol=1e-12, atol=1e-13,
                                   err_msg=f"{name} allreduce")
        topology[name] = [comm.intra_rank, comm.intra_size, comm.inter_rank, comm.inter_size]
        comm.finalize()
    from mnpar.communicators import _wait
    report(rank=rank, size=size, address=my_address(), topology=topology,
           spin_bandwidth=_wait.SPIN_BANDWIDTH, host=socket.gethostname())


if __name__ == "__main__":
    main()
