"""mnpar's domain exceptions: the few errors callers may want to catch."""
import warnings


class CommunicationError(RuntimeError):
    """A wait of mnpar cannot complete: the base of the errors below.

    Each message names this rank, the operation, the peer and tag it waited
    on and what for, so a failed wait reads as who waited for whom.
    """


class CommunicationTimeout(CommunicationError):
    """A blocking wait in mnpar ran past the communicator's timeout.

    The message names the operation, this rank, the peer, the tag and how
    long the rank waited, so a hang becomes a report of who waited for whom.
    """


class PeerLost(CommunicationTimeout):
    """Some rank has not been heard from for ``MNPAR_LOST_AFTER`` seconds (20 by
    default): its host was cut off, stopped or killed. The message names the
    silent ranks, their hosts and the hosts' other ranks."""


class PeerFinished(CommunicationError):
    """A rank this rank waits for has finished with the communicator: its program
    ended, it called ``finalize()``, or it failed. What this rank waits for will
    never come; the message says which rank finished, how and where (its last
    iteration), and what this rank was waiting for."""


class WiringError(ValueError):
    """The ranks' sends and receives do not match; running would deadlock."""


class DataSizeError(RuntimeError):
    """ChainerMN's name, kept so ``except chainermn.DataSizeError`` ports.

    ChainerMN 7.8.1 defines it and never raises it; neither does mnpar:
    ``scatter_dataset`` sends a dataset of any size in chunks of
    ``max_buf_len`` bytes.
    """


class MessageMismatchError(WiringError):
    """A message arrived that is not the one this rank's communication expects: a
    gradient of another shape or dtype than the arrays sent (``send``'s backward),
    or a gradient where a ``recv`` expects activations (a send whose delegate
    variable never reached the backward pass). Raised on both ranks: the one
    that finds it tells its peer, whose next receive from it raises the same
    report; the message names both ranks, the shapes and the fix."""


class UnreadMessageWarning(RuntimeWarning):
    """A message reached a rank that never received it (or a rank sent one that its
    peer never received) before the communicator ended: a send without its
    receive. The warning names both ranks, the tag, the size and what sent it."""


def warn_unread(text: str) -> None:
    """Issues an ``UnreadMessageWarning`` (``-W ignore::mnpar.UnreadMessageWarning``
    silences them)."""
    warnings.warn_explicit(text, UnreadMessageWarning, "mnpar", 0)
