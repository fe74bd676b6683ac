"""tests/run_suite.py: the MPI runs select the ``mpi`` tests, with the user's selection."""
from run_suite import selecting


def test_a_users_marker_expression_narrows_the_mpi_runs_instead_of_replacing_them():
    assert selecting("mpi", ["-q", "-m", "not slow or reference", "tests/x.py"]) == [
        "-q", "-m", "mpi and (not slow or reference)", "tests/x.py"]


def test_without_one_the_mpi_runs_select_the_mpi_tests():
    assert selecting("mpi", ["tests/x.py", "-k", "halo"]) == ["-m", "mpi", "tests/x.py", "-k",
                                                             "halo"]
