"""Runs an example with each rank's own training values noted, for tests/test_hybrid_examples.py.

    mpiexec -n N python tests/scripts/own_values.py EXAMPLE.py --out OUT [options]

Where the example calls ``common.report_means`` (which replaces ``main/loss`` and
``main/accuracy`` by their means over the ranks), a recorder is added first: it runs before
the aggregators (a writer's priority) and notes this rank's own values each iteration, with
the epoch the log puts them in; at the end the rank writes them to
``OUT/own_values.rank<R>.json``. The test then compares the example's log with them.
"""
import json
import os
import runpy
import sys

from chainer.training import extension
from mpi4py import MPI

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples")
sys.path.insert(1, EXAMPLES)
import common  # noqa: E402  the examples' own module: they find it in sys.modules

KEYS = ("main/loss", "main/accuracy")


class Recorder(extension.Extension):
    """Notes this rank's own ``KEYS`` each iteration; writes them when training ends."""

    trigger = 1, "iteration"
    priority = extension.PRIORITY_WRITER  # before ObservationAggregator (an editor)

    def __init__(self, path):
        self.path = path
        self.values = []

    def __call__(self, trainer):
        updater = trainer.updater
        row = {"epoch": updater.epoch + (0 if updater.is_new_epoch else 1)}
        for key in KEYS:
            if key in trainer.observation:
                row[key] = float(trainer.observation[key].array)
        self.values.append(row)

    def finalize(self):
        with open(self.path, "w") as f:
            json.dump(self.values, f)


def main():
    script, args = sys.argv[1], sys.argv[2:]
    out = args[args.index("--out") + 1]
    report_means = common.report_means

    def recorded(trainer, comm, keys=KEYS):
        rank = MPI.COMM_WORLD.rank
        trainer.extend(Recorder(os.path.join(out, f"own_values.rank{rank}.json")))
        report_means(trainer, comm, keys)

    common.report_means = recorded
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
