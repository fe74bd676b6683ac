"""Whether a converted model's forward has gathered its tiles into whole images.

``convert`` runs a model's forward inside ``spatial_functions``; once that
forward calls ``gather``, its activations are whole images on every rank,
and the convolutions and pooling after it must be chainer's own again (a
whole image read as a tile would take the neighbour's copy for its halo).
"""
import threading

_local = threading.local()


def gathered() -> bool:
    """True between a ``gather`` and the end of the converted forward that called it."""
    return getattr(_local, "gathered", None) is True


def enter() -> object:
    """A converted forward starts: nothing gathered yet. Returns what ``leave`` restores."""
    before = getattr(_local, "gathered", None)
    _local.gathered = False
    return before


def leave(before: object) -> None:
    _local.gathered = before


def mark_gathered() -> None:
    """``gather`` ran: inside a converted forward, what follows sees whole images."""
    if getattr(_local, "gathered", None) is False:
        _local.gathered = True
