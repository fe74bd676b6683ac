"""examples/tensor_parallel/train_lm.py, launched with ``mpiexec`` as a user would: in
float64 it logs one process's losses at tensor degrees 2 and 4, at 2 x 2 with data
parallelism, and with sequence parallelism; each rank holds its part of the model."""
import json
import os

import pytest
from test_examples_mlp import ROOT, run

SCRIPT = os.path.join(ROOT, "examples", "tensor_parallel", "train_lm.py")
SMALL = ["--dtype", "float64", "--steps", "4", "--log-interval", "2", "--units", "24",
         "--heads", "6", "--layers", "1", "--length", "12", "--batchsize", "4"]


def train(out_dir, n, *args):
    out = run([*SMALL, "--out", str(out_dir), *args], n=n, script=SCRIPT)
    with open(os.path.join(out_dir, "log.json")) as f:
        return out, json.load(f)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return train(tmp_path_factory.mktemp("one"), 1)


def same_losses(log, reference):
    assert [e["step"] for e in log["log"]] == [2, 4]
    for a, b in zip(log["log"], reference["log"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("n, args, layout", [
    (2, [], "tensor 2 x data 1"),
    (2, ["--sequence"], "tensor 2 x data 1 (naive, @numpy, float64, sequence parallel)"),
    (4, [], "tensor 4 x data 1"),
    (4, ["--data", "2"], "tensor 2 x data 2"),
])
def test_every_split_logs_one_process_losses(tmp_path, one_process, n, args, layout):
    out, log = train(tmp_path, n, *args)
    assert layout in out and "103 characters" in out
    same_losses(log, one_process[1])
    whole = one_process[1]["parameter_bytes"][0]
    degree = n // (2 if "--data" in args else 1)
    for part in log["parameter_bytes"]:  # each rank holds its part, and the whole norms
        assert part < whole / degree * 1.5
    assert "bytes of parameters" in out and "tokens/s" in out
