"""Every example, and the benchmarks that make sense on one GPU, take ``--gpu``.

Checked here on CPUs: each script's ``--help`` shows ``--gpu``; the GPU each
rank picks (``examples/common.py``), with a fake device count: its own where
the node has enough, shared round robin where not; and the messages where
cupy or a device is missing. tests/test_gpu_examples.py runs the examples
with ``--gpu`` on GPUs.
"""
import glob
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
from run_suite import ROOT

sys.path.insert(1, os.path.join(ROOT, "examples"))
import common  # noqa: E402  examples/common.py

SCRIPTS = ["examples/mlp/train_mlp.py", "examples/seq2seq/train_seq2seq.py",
           "examples/pipeline/train_pipeline.py", "examples/data_parallel/train_mlp.py",
           "examples/dual_parallel/train_dual.py", "examples/spatial/train_denoise.py",
           "examples/spatial/large_images.py", "examples/spatial/train_gb.py",
           "examples/tensor_parallel/train_lm.py",
           "benchmarks/bench_spatial.py",
           "benchmarks/bench_pipeline.py"]

# One process prints every script's --help: chainer and mnpar are imported once, and the
# examples' own modules (two are called models.py) are forgotten between scripts.
HELP_ALL = textwrap.dedent("""\
    import contextlib, io, os, runpy, sys, warnings
    warnings.simplefilter("ignore")
    root = os.getcwd()
    for script in sys.argv[1:]:
        for name, module in list(sys.modules.items()):
            where = getattr(module, "__file__", None) or ""
            if where.startswith(tuple(os.path.join(root, d) for d in ("examples", "benchmarks"))):
                del sys.modules[name]
        path, argv = list(sys.path), sys.argv
        sys.argv = [script, "--help"]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as python script.py
        text = io.StringIO()
        code = None
        with contextlib.redirect_stdout(text):
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as end:
                code = end.code
        sys.path[:], sys.argv = path, argv
        print(f"===== {script} exit {code}")
        print(text.getvalue())
""")


def test_every_example_is_listed():
    examples = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "examples", "*",
                                                                         "*.py"))}
    mains = {p for p in examples if "__main__" in open(os.path.join(ROOT, p)).read()}
    assert mains == {s for s in SCRIPTS if s.startswith("examples/")}


def test_every_example_and_the_one_gpu_benchmarks_show_gpu_in_their_help():
    proc = subprocess.run([sys.executable, "-c", HELP_ALL, *SCRIPTS], cwd=ROOT, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    parts = proc.stdout.split("===== ")[1:]
    assert [p.split(" exit ")[0] for p in parts] == SCRIPTS
    for part in parts:
        head, _, text = part.partition("\n")
        assert head.endswith("exit 0"), part
        assert "--gpu" in text and "usage:" in text, part


def fake_comm(intra_rank, intra_size):
    return SimpleNamespace(intra_rank=intra_rank, intra_size=intra_size)


@pytest.mark.parametrize("ranks, gpus, picked", [
    (2, 4, [0, 1]),           # enough GPUs: one each
    (4, 4, [0, 1, 2, 3]),
    (4, 2, [0, 1, 0, 1]),     # fewer: shared round robin
    (3, 1, [0, 0, 0]),
])
def test_each_rank_takes_its_own_gpu_where_there_are_enough_else_shares(ranks, gpus, picked,
                                                                         capsys):
    assert [common.gpu_of(fake_comm(r, ranks), gpus) for r in range(ranks)] == picked
    err = capsys.readouterr().err
    if ranks > gpus:  # said once, by the node's first rank
        assert err == f"note: {ranks} ranks share this node's {gpus} GPU(s)\n"
    else:
        assert err == ""


def test_no_device_is_one_clear_error():
    with pytest.raises(RuntimeError, match="no CUDA device on this node.*leave out --gpu"):
        common.gpu_of(fake_comm(0, 2), 0)


def test_without_cupy_gpu_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(RuntimeError, match="--gpu needs cupy .*or leave out --gpu"):
        common.device_of(fake_comm(0, 1), True)


def test_without_gpu_the_device_is_the_cpu():
    assert str(common.device_of(fake_comm(0, 1), False)) == "@numpy"
