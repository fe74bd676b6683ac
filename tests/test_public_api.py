"""ChainerMN's public names exist in mnpar, so code ports by changing the import.

The test reads ChainerMN's own modules (inside the chainer wheel) and fails
if one of their public classes or functions is missing from mnpar's module
of the same name: mnpar provides every one.
"""
import inspect
import warnings

import pytest

import mnpar

MODULES = ["", "functions", "links", "datasets", "extensions", "iterators", "optimizers",
           "communicators", "global_except_hook"]


def public_api(module):
    """The public classes and functions a module offers, not the modules it imports."""
    return {name for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value)}


@pytest.mark.chainermn
@pytest.mark.parametrize("name", MODULES)
def test_chainermn_names_exist_in_mnpar(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import chainermn
    theirs = chainermn if not name else getattr(chainermn, name)
    ours = mnpar if not name else getattr(mnpar, name)
    missing = sorted(public_api(theirs) - set(dir(ours)))
    assert not missing, f"mnpar.{name or '<top>'} lacks ChainerMN's {missing}"


def test_aliases_are_the_same_objects():
    assert mnpar.scatter_index is mnpar.datasets.scatter_index
    assert mnpar.DataSizeError is mnpar.datasets.DataSizeError
    assert issubclass(mnpar.DataSizeError, RuntimeError)
    assert mnpar.CommunicatorBase is mnpar.communicators.CommunicatorBase
