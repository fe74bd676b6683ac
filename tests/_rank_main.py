"""One rank of an MPI test run: pytest with this rank's output in its own log.

Used by ``run_suite.py`` as ``mpiexec -n N python tests/_rank_main.py LOGDIR
PYTEST-ARGS...``. Keeping each rank's output apart means a failure is shown
whole, not interleaved with the other ranks' noise.
"""
import os
import sys

from mpi4py import MPI


def main() -> int:
    logdir = sys.argv[1]
    rank = MPI.COMM_WORLD.rank
    log = open(os.path.join(logdir, f"rank{rank}.log"), "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    os.environ["MNPAR_TEST_REPORT"] = os.path.join(logdir, f"rank{rank}.json")
    import pytest

    code = int(pytest.main(sys.argv[2:]))
    sys.stdout.flush()
    # 5 is pytest's "no tests collected": a rank count with nothing to run is fine.
    return 0 if code == pytest.ExitCode.NO_TESTS_COLLECTED else code


if __name__ == "__main__":
    sys.exit(main())
