"""ChainerMN's ``global_except_hook`` under its own name.

mnpar installs its fail-fast hook when it is imported (``mnpar._failfast``),
so ChainerMN code that calls ``add_hook()`` keeps working and changes
nothing, unless ``MNPAR_ABORT_ON_ERROR=0`` turned the automatic hook off:
then the explicit call installs it, as ChainerMN's does.
"""
from ._failfast import install

__all__ = ["add_hook"]


def add_hook() -> None:
    """Makes an uncaught exception on any rank end the whole job (``MPI_Abort``).

    Example::

        import mnpar as chainermn
        chainermn.global_except_hook.add_hook()
    """
    install(force=True)
