"""The one exception of the checkpoint format."""


class CheckpointError(ValueError):
    """A checkpoint cannot be written or loaded: raised on every rank, naming the file
    and the array; nothing was written over (a load assigns nothing until every rank
    has read everything it needs)."""
