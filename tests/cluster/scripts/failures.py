"""Trains a little while across test hosts until something fails (the test cuts a host).

Every rank sums an array with every other, over and over, printing each
step; what ended it is in the launcher's output: the tests read it. Where
``FAILURES_STARTED`` names a file, rank 0 makes it once every rank has summed
20 times: the test acts after that, however long the start took.
"""
import os
import sys
import time

import numpy as np

import mnpar


def main():
    comm = mnpar.create_communicator(sys.argv[1] if len(sys.argv) > 1 else "naive")
    x = np.ones(1024)
    start = time.monotonic()
    step = 0
    while True:
        comm.allreduce(x)
        step += 1
        if step % 20 == 0:
            print(f"rank {comm.rank} step {step} at {time.monotonic() - start:.1f} s",
                  flush=True)
            if step == 20 and comm.rank == 0 and os.environ.get("FAILURES_STARTED"):
                open(os.environ["FAILURES_STARTED"], "w").close()
        time.sleep(0.01)


if __name__ == "__main__":
    main()
