"""Trains a little while across test hosts until something fails (the test cuts a host).

Every rank sums an array with every other, over and over, printing each
step; what ended it is in the launcher's output: the tests read it.
"""
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
        time.sleep(0.01)


if __name__ == "__main__":
    main()
