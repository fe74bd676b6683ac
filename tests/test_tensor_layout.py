"""Where a cut axis goes through reshapes and axis functions: pure functions of shapes,
without MPI; and the rules table names chainer's own function nodes."""
import importlib
import re

import chainer
import pytest

from mnpar.tensor import _layout, _rules
from mnpar.tensor._errors import Refusal
from mnpar.tensor._marks import Shard


class Group:
    """A stand-in communicator: ``size`` ranks, this one ``rank``."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size


def cut(rank, bounds, axis, total=None, pre=1):
    return Shard(Group(rank, len(bounds) - 1), axis, total or bounds[-1], tuple(bounds), pre)


@pytest.mark.parametrize("rank", [0, 1])
def test_heads_split_and_join_again(rank):
    m = cut(rank, (0, 6, 12), axis=2)  # (B, T, heads * 3): 4 heads of 3, two each
    local = (2, 5, 6)
    shape, heads = _layout.reshaped(m, local, (2, -1, 4, 3))
    assert shape == (2, 5, 2, 3) and (heads.axis, heads.total, heads.bounds) == (2, 4, (0, 2, 4))
    back, joined = _layout.reshaped(heads, shape, (2, 5, 12))
    assert back == local and joined == m


@pytest.mark.parametrize("rank, rows", [(0, 3), (1, 2)])
def test_a_sequence_cut_merged_with_the_batch_keeps_its_blocks(rank, rows):
    m = cut(rank, (0, 3, 5), axis=1)  # (B=2, T=5, D=4), T cut 3 + 2
    shape, merged = _layout.reshaped(m, (2, rows, 4), (-1, 4))
    assert shape == (2 * rows, 4) and (merged.axis, merged.pre, merged.total) == (0, 2, 5)
    # one process's shape (2, -1, 4), or this rank's (2, rows, 4): both come back
    assert _layout.reshaped(merged, shape, (2, -1, 4)) == ((2, rows, 4), m)
    assert _layout.reshaped(merged, shape, (2, rows, 4)) == ((2, rows, 4), m)


def test_a_cut_that_a_reshape_would_scatter_is_refused():
    m = cut(0, (0, 4, 8), axis=1)  # (3, 8) cut in columns
    with pytest.raises(Refusal, match=r"its target shape \(8, 3\) does not keep this rank's "
                                      r"part of the whole \(3, 8\) cut along axis 1"):
        _layout.reshaped(m, (3, 4), (8, 3))
    with pytest.raises(Refusal, match="does not keep"):  # heads of 3 across a cut at 4
        _layout.reshaped(m, (3, 4), (3, 2, 4)[:1] + (-1, 3))


def test_a_degree_of_one_prefers_the_cut_without_blocks():
    m = cut(0, (0, 12), axis=2)
    assert _layout.reshaped(m, (2, 5, 12), (2, 5, 3, 4))[1].axis == 2


def test_axes_move_and_go():
    m = cut(0, (0, 2, 4), axis=1)
    assert _layout.permuted(m, (0, 2, 1, 3)).axis == 2
    assert _layout.inserted(m, 3, 0).axis == 2 and _layout.inserted(m, 3, -1).axis == 1
    assert _layout.removed(m, 4, (0,), "it").axis == 0
    with pytest.raises(Refusal, match="it removes the cut axis 1"):
        _layout.removed(m, 4, (1,), "it")
    assert _layout.resolve((2, -1), 10) == (2, 5) and _layout.resolve((3, -1), 10) is None


def test_every_rule_names_a_function_node_of_chainer():
    for name in _rules.RULES:
        module, cls = name.rsplit(".", 1)
        node = getattr(importlib.import_module(f"chainer.functions.{module}"), cls)
        assert issubclass(node, (chainer.FunctionNode, chainer.Function)), name


def test_the_docs_table_names_every_function_of_the_rules():
    from run_suite import ROOT

    from mnpar.tensor._guard import function_name

    with open(f"{ROOT}/docs/tensor.rst") as f:
        page = f.read()
    missing = []
    for name in _rules.RULES:
        module, cls = name.rsplit(".", 1)
        node = getattr(importlib.import_module(f"chainer.functions.{module}"), cls)
        shown = function_name(node.__new__(node)).split(" ")[0]
        if shown.startswith("F.") and shown not in page and cls.lower() not in (
                "add", "sub", "mul", "div", "neg", "addconstant", "subfromconstant",
                "mulconstant", "divfromconstant", "powvarvar", "powvarconst",
                "powconstvar", "multiadd"):
            missing.append(shown)
    assert not missing, f"docs/tensor.rst's table lacks {missing}"


def test_the_docs_table_names_every_link_of_chainer():
    import inspect

    import chainer.links as L
    from run_suite import ROOT

    with open(f"{ROOT}/docs/tensor.rst") as f:
        page = f.read()
    links = [n for n in dir(L) if inspect.isclass(getattr(L, n))
             and issubclass(getattr(L, n), chainer.Link)]
    missing = [n for n in links if not re.search(rf"L\.{n}\b", page)]
    assert not missing, f"docs/tensor.rst's table of links lacks {missing}"
