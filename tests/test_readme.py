"""README.rst's quickstart runs as printed: saved as a script, launched with ``mpiexec -n 2``."""
import os
import re

import pytest
from test_examples_mlp import ROOT, run  # run: launches with a hard timeout


def quickstart() -> str:
    with open(os.path.join(ROOT, "README.rst"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("Quickstart\n"):text.index("Launching with mpiexec")]
    block = re.search(r"\.\. code:: python\n\n((?:   .*\n|\n)+)", section)[1]
    return "\n".join(line[3:] for line in block.splitlines()) + "\n"


@pytest.mark.slow
def test_the_quickstart_trains_at_two_ranks(tmp_path):
    code = quickstart()
    assert "mnpar.MultiNodeChainList(comm)" in code and "load_digits" in code
    script = tmp_path / "train.py"
    # After the README's lines: rank 0 reports its final loss on the training set.
    script.write_text(code + 'print(f"rank {comm.rank} done, loss {updater.get_optimizer('
                      '\'main\').target.loss.array if comm.rank == 0 else 0:.3f}")\n')
    out = run([], script=str(script))
    loss = float(re.search(r"rank 0 done, loss (\d+\.\d+)", out)[1])
    assert loss < 0.5  # 10 classes: chance is 2.3
    assert "rank 1 done" in out
