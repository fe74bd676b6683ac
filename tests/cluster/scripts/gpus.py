"""One rank of test_slurm_gpus: the GPU mnpar gives it, from what Slurm set.

Each rank prints ``RESULT {json}``: its host, ``intra_rank``, what
``CUDA_VISIBLE_DEVICES`` says, and the device ``gpu_of`` picks (index and
name). Slurm's pretend GPUs (``_slurm.py``) need no driver.
"""
import os
import socket

from _report import report

import mnpar
from mnpar.communicators._devices import gpu_of


def main() -> None:
    comm = mnpar.create_communicator("naive", timeout=30)
    index, name = gpu_of(comm)
    report(rank=comm.rank, host=socket.gethostname(), intra_rank=comm.intra_rank,
           intra_size=comm.intra_size, visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
           index=index, name=name)
    comm.finalize()


if __name__ == "__main__":
    main()
