"""The spatial package's errors (no imports: the geometry's pure functions raise them too)."""


class SpatialError(ValueError):
    """A function that cannot run on tiles, or tiles that do not fit together.

    Raised on every rank of the grid alike, before anything wrong is computed;
    the message names the function, the layer and the fix.
    """
