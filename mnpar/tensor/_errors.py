"""The tensor package's errors (no imports: the layout's pure functions raise them too)."""
from typing import Optional


class TensorParallelError(ValueError):
    """A function that is not exact on parts split over the tensor group, or a plan or
    model that cannot be split as asked.

    Raised on every rank of the group alike, before anything wrong is computed;
    the message names the function or link, the layer and the fix.
    """


class Refusal(Exception):
    """A rule's answer: the function cannot run on these parts (``why``; ``fix``)."""

    def __init__(self, why: str, fix: Optional[str] = None) -> None:
        super().__init__(why)
        self.why = why
        self.fix = fix


GATHER = ("gather the parts first (mnpar.functions.gather_from_group(comm, h, axis)), or plan "
          "the layer before it to give whole activations (Column(gather_output=True))")
