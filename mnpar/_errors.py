"""mnpar's domain exceptions: the few errors callers may want to catch."""


class CommunicationTimeout(RuntimeError):
    """A blocking wait in mnpar ran past the communicator's timeout.

    The message names the operation, this rank, the peer, the tag and how
    long the rank waited, so a hang becomes a report of who waited for whom.
    """


class PeerLost(CommunicationTimeout):
    """Some rank has not been heard from for ``MNPAR_LOST_AFTER`` seconds (20 by
    default): its host was cut off, stopped or killed. The message names the
    silent ranks, their hosts and the hosts' other ranks."""


class WiringError(ValueError):
    """The ranks' sends and receives do not match; running would deadlock."""


class DataSizeError(RuntimeError):
    """ChainerMN's name, kept so ``except chainermn.DataSizeError`` ports.

    ChainerMN 7.8.1 defines it and never raises it; neither does mnpar:
    ``scatter_dataset`` sends a dataset of any size in chunks of
    ``max_buf_len`` bytes.
    """
