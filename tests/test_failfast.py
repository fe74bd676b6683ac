"""An uncaught exception on one rank ends every rank, with one marked traceback."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
SCRIPT = textwrap.dedent("""
    import numpy as np
    import mnpar
    comm = mnpar.create_communicator("naive", timeout=300)
    if comm.rank == 1:
        raise RuntimeError("boom on purpose")
    comm.recv(1)  # would wait 300 s for the dead rank without fail-fast
""")


def run(tmp_path, env_extra, n=2):
    script = tmp_path / "crash.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, **env_extra)
    start = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, str(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - start


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_one_rank_failing_ends_the_job_quickly(tmp_path, n):
    proc, took = run(tmp_path, {}, n)
    assert proc.returncode != 0
    assert took < 10 + 5  # 10 s target, plus start-up of the interpreters
    err = proc.stderr
    assert err.count("[rank 1] RuntimeError: boom on purpose") == 1
    assert "[rank 1] Traceback (most recent call last):" in err
    assert "[rank 0]" not in err and "[rank 2]" not in err


@pytest.mark.slow
def test_can_be_turned_off(tmp_path):
    script = tmp_path / "off.py"
    script.write_text(textwrap.dedent("""
        import sys
        import mnpar
        from mnpar import _failfast
        print(sys.excepthook is _failfast._hook)
        mnpar.global_except_hook.add_hook()  # ChainerMN's explicit call turns it back on
        print(sys.excepthook is _failfast._hook)
        mnpar.global_except_hook.add_hook()
        print(_failfast._previous is not _failfast._hook)
    """))
    env = dict(os.environ, MNPAR_ABORT_ON_ERROR="0")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=60).stdout
    assert out.split() == ["False", "True", "True"]


@pytest.mark.slow
def test_an_error_raised_on_every_rank_is_printed_by_every_rank(tmp_path):
    # Regression: the first rank's MPI_Abort killed the others before they printed
    # their own traceback; each hook now waits (a second at most) for the others'.
    script = tmp_path / "everyone.py"
    script.write_text(textwrap.dedent("""
        import mnpar
        comm = mnpar.create_communicator("naive")
        comm.allgather_obj(None)  # every rank is here
        raise ValueError(f"the same mistake, found on rank {comm.rank}")
    """))
    for _ in range(2):
        start = time.monotonic()
        proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(script)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0
        assert time.monotonic() - start < 15, proc.stderr
        for rank in range(3):
            assert (f"[rank {rank}] ValueError: the same mistake, found on rank {rank}"
                    in proc.stderr), proc.stderr


def test_lines_written_while_an_exception_is_handled_carry_the_rank(monkeypatch):
    # chainer's Trainer prints the exception and its traceback in its except block,
    # before the hook: in a job of several ranks, those lines say which rank wrote them.
    import io

    from mnpar import _failfast

    monkeypatch.setattr(_failfast, "_rank_label", "[rank 3] ")
    out = io.StringIO()
    stream = _failfast.RankedLines(out)
    stream.write("before\n")
    try:
        raise RuntimeError("x")
    except RuntimeError:
        stream.write("Exception in main training loop: x\nTraceback")
        stream.write(" (most recent call last):\n")
        stream.write("[rank 3] already marked\n")
    stream.write("after\n")
    assert out.getvalue() == ("before\n[rank 3] Exception in main training loop: x\n"
                              "[rank 3] Traceback (most recent call last):\n"
                              "[rank 3] already marked\nafter\n")
    assert stream.getvalue() == out.getvalue()  # the stream's own attributes
