"""One rank of test_system_mpi's traffic checks: 8 MB summed between two hosts, mpi4py
alone (no mnpar, so it starts in a second); rank 0 prints ``RESULT {json}``."""
import numpy as np
from _report import report
from mpi4py import MPI


def main() -> None:
    world = MPI.COMM_WORLD
    x = np.full(1 << 20, world.rank + 1.0)
    y = np.empty_like(x)
    world.Allreduce(x, y)
    assert (y == world.size * (world.size + 1) / 2).all()
    names = world.gather(MPI.Get_processor_name())
    if world.rank == 0:
        report(rank=0, hosts=names, library=MPI.Get_library_version().split("\n")[0])


if __name__ == "__main__":
    main()
