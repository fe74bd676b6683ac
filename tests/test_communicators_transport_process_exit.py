"""The transport at process boundaries: run in one process, with its own ``mpiexec``."""
import os
import subprocess
import sys
import textwrap

SENDER_EXITS = textwrap.dedent("""
    import gc, time
    import numpy as np
    import mnpar
    comm = mnpar.create_communicator("naive", timeout=30)
    n = 3000
    if comm.rank > 0:
        for i in range(n):
            comm.send(np.full(4, i, np.float32), 0)
        del comm
        gc.collect()  # dropped without finalize(), as ChainerMN code does
    else:
        time.sleep(1.0)  # the senders are long gone when this rank receives
        for source in range(1, comm.size):
            got = [int(comm.recv(source)[0]) for _ in range(n)]
            assert got == list(range(n)), (source, got[:5])
        print("received all", n)
""")


def test_sends_in_flight_survive_a_dropped_communicator_and_the_senders_exit(tmp_path):
    # Regression: small sends are non-blocking; a communicator garbage-collected
    # without finalize() freed their requests and buffers, and a process that
    # exited lost them, so the receiver read freed memory ("header version 4",
    # ChainerMN's test_synchronized_iterator at 3 ranks) or waited forever.
    script = tmp_path / "exits.py"
    script.write_text(SENDER_EXITS)
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    proc = subprocess.run([mpiexec, "-n", "3", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "received all 3000" in proc.stdout
