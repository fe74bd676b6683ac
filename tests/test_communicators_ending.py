"""Ranks that finish: their peers learn it within seconds, and nothing sent is left unread.

Each job runs under its own ``mpiexec`` with the default settings (a 600 s
timeout, fail-fast on): a rank that waits for one that has finished must end
the job with ``PeerFinished`` within seconds of the end, naming the rank, how
it ended and where, and what it waited for. Messages nobody received are
reported as ``UnreadMessageWarning`` at the end, while a correct program
(several models on subsets of the ranks included) ends without a word.
"""
import os
import re
import subprocess
import sys
import time

import pytest

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "endings.py")
SOON = 5.0  # seconds from a rank's end to the job's end
CUT = 3000  # characters of output shown by a failed assertion

# Each case of scripts/endings.py in which a rank waits for one that finished: the
# PeerFinished text some rank must raise (tests/cluster runs them across hosts too).
FINISHED = {
    "missing_send": r"\[rank [12]\] mnpar\._errors\.PeerFinished: rank [12]: recv with rank 0, "
                    r"tag 4 cannot complete: rank 0 has finished: its program ended; waiting "
                    r"for a message from rank 0",
    "large_unreceived": r"\[rank 0\] mnpar\._errors\.PeerFinished: rank 0: send with rank 1, "
                        r"tag 0 cannot complete: rank 1 has finished: its program ended; "
                        r"waiting for rank 1 to receive 67108864 bytes",
    "skipped_collective": r"PeerFinished: rank [01]: allreduce cannot complete: rank \d has "
                          r"finished: its program ended; waiting for every rank to join",
    "unequal_iterations": r"\[rank 0\] mnpar\._errors\.PeerFinished: rank 0: recv with rank 1, "
                          r"tag 0 cannot complete: rank 1 has finished: its program ended "
                          r"after forward pass 4 of its MultiNodeChainList \(this rank is in "
                          r"forward pass 5 of its MultiNodeChainList\); waiting for a message "
                          r"from rank 1; forward pass: the arrays rank 1 sends with "
                          r"functions.send",
    "never_forwards": r"\[rank 0\] mnpar\._errors\.PeerFinished: rank 0: MultiNodeChainList recv "
                      r"from rank 1, tag 0 cannot complete: rank 1 has finished: its program "
                      r"ended \(this rank is in forward pass 1 of its MultiNodeChainList\); "
                      r"waiting for the activations rank 1 sends to this component; rank 1 "
                      r"has not sent this model's wiring",
    "finalized": r"PeerFinished: rank 1: recv with rank 0, tag 0 cannot complete: rank 0 "
                 r"called finalize\(\) on the communicator; waiting",
    "failed": r"PeerFinished: rank 1: recv with rank 0, tag 0 cannot complete: rank 0 failed "
              r"\(ValueError: bad input on purpose\)",
}
# MNPAR_ABORT_ON_ERROR=0 for "failed" (and "repeat_unreceived"): nothing aborts the
# job; the failed rank's end notice ends its peer's wait.
ENV = {case: {"MNPAR_ABORT_ON_ERROR": "0"} for case in ("failed", "repeat_unreceived")}
UNREAD = "mnpar:0: UnreadMessageWarning: rank 1: a message from rank 0 was never received: "
UNREAD_LINES = [
    UNREAD + "tag 3, 40 bytes: a float32 array of shape (10,), sent by comm.send or "
             "mnpar.functions.send",
    UNREAD + "tag 4, 21 bytes: a pickled object sent by comm.send_obj",
    UNREAD + "tag 5, 40 bytes: a tuple of 2 arrays (float64 (3,), int32 (2, 2)), sent by "
             "comm.send or mnpar.functions.send",
]


def launch(case, n):
    env = dict(os.environ)
    for name in ("MNPAR_TIMEOUT", "MNPAR_ABORT_ON_ERROR", "MNPAR_HEARTBEAT"):
        env.pop(name, None)  # the defaults, as a user has them
    env.update(ENV.get(case, {}))
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, SCRIPT, case], env=env,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic()


def check_finished(case, code, err, ended):
    """The job failed with the case's PeerFinished text within ``SOON`` s of a rank's end."""
    assert code not in (0, None), err[-CUT:]
    assert re.search(FINISHED[case], err), err[-CUT:]
    finishes = [float(t) for t in re.findall(r"rank \d+ finishes at ([0-9.]+)", err)]
    assert finishes and ended - min(finishes) < SOON, err[-CUT:]
    assert "CommunicationTimeout" not in err, err[-CUT:]


@pytest.mark.slow
@pytest.mark.parametrize("case, n", [(c, n) for c in FINISHED for n in (2, 3)
                                     if n == 2 or c in ("missing_send", "large_unreceived",
                                                        "skipped_collective")])
def test_a_wait_for_a_rank_that_finished_ends_the_job_within_seconds(case, n):
    code, _, err, ended = launch(case, n)
    check_finished(case, code, err, ended)


@pytest.mark.slow
def test_an_unread_repeated_payload_is_reported_as_the_array_it_is():
    # Its header came with the first message: the drain at the end knows it (``_repeats``).
    code, _, err, ended = launch("repeat_unreceived", 2)
    assert code not in (0, None), err[-CUT:]
    assert ("PeerFinished: rank 0: send with rank 1, tag 0 cannot complete: rank 1 has "
            "finished: its program ended; waiting for rank 1 to receive 1048576 bytes") in err
    finishes = [float(t) for t in re.findall(r"rank \d+ finishes at ([0-9.]+)", err)]
    assert finishes and ended - min(finishes) < SOON, err[-CUT:]
    assert UNREAD + ("tag 0, 1048576 bytes: a float32 array of shape (262144,), sent by "
                     "comm.send or mnpar.functions.send") in err.splitlines(), err[-CUT:]


@pytest.mark.slow
def test_a_finished_rank_stops_no_wait_on_other_ranks():
    code, out, err, _ = launch("others_go_on", 3)
    assert code == 0, err[-CUT:]
    assert sorted(re.findall(r"rank (\d) done", out)) == ["0", "1", "2"], out
    assert "Warning" not in err and "Error" not in err, err[-CUT:]


@pytest.mark.slow
def test_unread_messages_are_reported_at_the_end():
    code, out, err, _ = launch("unread", 2)
    assert code == 0, err[-CUT:]
    assert [line for line in err.splitlines() if "Warning" in line] == UNREAD_LINES, err


@pytest.mark.slow
def test_an_unread_message_names_the_construct_that_sent_it():
    # Regression (issue 40): a MultiNodeChainList's message was "sent by comm.send or
    # mnpar.functions.send"; its rank's end notice now names what sends on that route.
    code, out, err, _ = launch("unread_chain_list", 2)
    assert code == 0, err[-CUT:]
    assert [line for line in err.splitlines() if "Warning" in line] == [
        UNREAD + "tag 0, 8 bytes: a float32 array of shape (1, 2), sent by a "
                 "MultiNodeChainList"], err


@pytest.mark.slow
def test_several_models_on_subsets_of_the_ranks_end_without_a_word():
    # Wiring announcements reach ranks outside a model, which never read them: they
    # are received at the end, silently (across hosts MPI used to warn of each).
    code, out, err, _ = launch("several_models", 3)
    assert code == 0, err[-CUT:]
    assert out.count("done") == 3
    assert err == "", err


def test_discard_unread_still_drops_silently_in_process():
    # In one process there are no peers: ending and discarding are no-ops.
    import mnpar
    from mnpar.communicators._objects import discard_unread

    comm = mnpar.create_communicator("naive")
    assert discard_unread(comm._t) == 0
    comm.finalize()
    comm.finalize()  # twice is harmless


def test_failing_is_true_only_while_an_exception_unwinds():
    from mnpar._failfast import died, failing

    seen = []
    try:
        try:
            raise KeyError("x")
        finally:
            seen.append(failing())
    except KeyError:
        seen.append(failing())
    seen.append(failing())
    try:
        raise SystemExit(0)
    except SystemExit:
        seen.append(failing())  # sys.exit(0) is no failure
    assert seen == [True, True, False, False]
    assert died() is None or not isinstance(died(), SystemExit)


def test_cleanup_while_an_exception_unwinds_only_tells_the_peers():
    # Regression: chainer's Trainer finalizes the updater in a finally block before
    # re-raising; PipelineUpdater.finalize freed the channel collectively and the
    # failing rank waited for peers that waited for it, so the abort never ran.
    # (The fault matrix, tests/test_fault_matrix.py, runs this across ranks.)
    from mpi4py import MPI

    import mnpar

    comm = mnpar.create_communicator("naive")
    channel = comm.channel(" through the pipeline")
    with pytest.raises(RuntimeError, match="unwinding"):
        try:
            raise RuntimeError("unwinding")
        finally:
            channel.free()  # the end notices only: freed at exit, or below
            comm.finalize()
            assert channel.line.announced and channel.comm != MPI.COMM_NULL
    channel.free()
    comm.finalize()
    assert channel.line.announced and channel.comm == MPI.COMM_NULL
