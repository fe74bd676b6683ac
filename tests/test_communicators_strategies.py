"""The strategies' table: every averaging strategy one row, checked at import; nothing else
chooses one by its name. In one process: no MPI traffic."""
import ast
import glob
import os

import chainer
import numpy as np
import pytest
from mpi4py import MPI

import mnpar
from mnpar.communicators import NAMES, _strategies
from mnpar.communicators._communicator import Communicator
from mnpar.communicators._reducers import FlatReducer
from mnpar.communicators._strategies import (
    MODELLED,
    STRATEGIES,
    Strategy,
    cost_of,
    flat_cost,
    strategy_of,
)
from mnpar.pipeline import CostModel, Link, hosts_of

ROOT = os.path.dirname(os.path.abspath(mnpar.__file__))


def test_the_names_come_from_the_table_in_its_order():
    assert NAMES == ("naive", "flat", "hierarchical", "pure_nccl")
    assert [row.name for row in STRATEGIES] == list(NAMES)
    assert MODELLED == ("naive", "flat", "hierarchical")


def test_the_rows_say_what_the_strategies_are():
    assert [row.reducer.__name__ for row in STRATEGIES] == [
        "NaiveReducer", "FlatReducer", "HierarchicalReducer", "PureNcclReducer"]
    assert [(row.wire_dtype, row.nccl) for row in STRATEGIES] == [
        (False, False), (False, False), (False, False), (True, True)]
    comm = mnpar.create_communicator("flat")
    assert comm.strategy is strategy_of("flat") and type(comm._reducer) is FlatReducer
    comm.finalize()


def test_an_unknown_name_is_an_error_not_a_fallback():
    with pytest.raises(ValueError, match=r"unknown communicator_name 'ring'; valid names: "
                                         r"\['naive', 'flat', 'hierarchical', 'pure_nccl'\]"):
        strategy_of("ring")
    with pytest.raises(ValueError, match=r"strategy='pure_nccl' is not one of \('naive', "):
        cost_of("pure_nccl")  # a row without a cost is not modelled
    with pytest.raises(ValueError, match="strategy='ring' is not one of"):
        CostModel(hosts_of([1, 1]), Link(0, 1), Link(0, 1)).allreduce([0, 1], [8], "ring")


class Tree(FlatReducer):
    """A reducer of the tests' own: the flat one under another name."""


class Dtyped(FlatReducer):
    def set_wire_dtype(self, allreduce_grad_dtype):
        pass


@pytest.mark.parametrize("fields, match", [
    (dict(reducer=dict), "reducer=<class 'dict'> is not a FlatReducer class"),
    (dict(reducer=Tree, cost=3), "cost=3 is not callable"),
    (dict(reducer=Tree, wire_dtype=True),
     "wire_dtype=True but its reducer does not override set_wire_dtype"),
    (dict(reducer=Dtyped), "wire_dtype=False but its reducer overrides set_wire_dtype"),
    (dict(reducer=Tree, nccl=True), "nccl=True but its reducer does not override nccl_group"),
])
def test_a_half_made_row_fails_where_it_is_written(fields, match):
    # Rows are built when _strategies is imported: a bad row stops the import.
    with pytest.raises(ValueError, match=f"strategy 'tree': {match}"):
        Strategy("tree", **fields)


def test_a_name_twice_in_the_table_fails():
    with pytest.raises(ValueError, match="strategy 'flat' is in the table twice"):
        _strategies._index(STRATEGIES + (Strategy("flat", Tree, flat_cost),))


def test_a_new_strategy_is_one_row(monkeypatch):
    # A reducer class and a row: the communicator averages with it, the cost model
    # prices it, and nothing else names it.
    def tree_cost(net, ranks, sizes):
        return 2 * net.ring(ranks, sum(sizes))

    monkeypatch.setitem(_strategies.BY_NAME, "tree", Strategy("tree", Tree, tree_cost))
    comm = Communicator(MPI.COMM_WORLD, "tree")
    assert type(comm._reducer) is Tree and comm.name == "tree"
    model = chainer.links.Linear(2, 3, initialW=np.ones((3, 2), np.float32))
    model.W.grad = np.full((3, 2), comm.size, np.float32)
    model.b.grad = np.zeros(3, np.float32)
    comm.multi_node_mean_grad(model)
    np.testing.assert_array_equal(model.W.grad, np.full((3, 2), comm.size, np.float32))
    comm.finalize()
    link = Link(latency=1e-5, bandwidth=1e9)
    model = CostModel(hosts_of([1, 1]), link, link)
    assert model.allreduce([0, 1], [1000], "tree") == pytest.approx(
        2 * model.allreduce([0, 1], [1000], "flat"))


def _names_compared(path, keys=True):
    """(line, name) of each strategy name a module compares a value with or (``keys``)
    keys a dict by."""
    found = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Compare):
            operands = [node.left] + node.comparators
        elif isinstance(node, ast.Dict) and keys:
            operands = [k for k in node.keys if k is not None]
        else:
            continue
        for operand in operands:
            items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [
                operand]
            found += [(node.lineno, item.value) for item in items
                      if isinstance(item, ast.Constant) and item.value in NAMES]
    return found


def test_no_module_but_the_table_chooses_a_strategy_by_its_name():
    # Regression: pipeline/_cost.py had `if strategy == "naive"` and its own list of
    # names, and the communicator `if self.name == "pure_nccl"`, so a strategy added
    # to the communicators had no cost and no options until each was found.
    offenders = {}
    for path in glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True):
        name = os.path.relpath(path, ROOT)
        # Dictionaries keyed by a name only where strategies are used ("flat" is also a
        # checkpoint's JSON key).
        found = _names_compared(path, keys=name.split(os.sep)[0] in ("communicators",
                                                                       "pipeline"))
        if found:
            offenders[name] = found
    assert offenders == {}
    assert _names_compared(os.path.join(ROOT, "communicators", "_strategies.py")) == []


def test_the_check_finds_a_name_compared_or_keyed(tmp_path):
    path = tmp_path / "chooser.py"
    path.write_text('if comm.name == "pure_nccl":\n    pass\n'
                    'COST = {"naive": 1}\nok = comm.strategy.nccl\n')
    assert _names_compared(str(path)) == [(1, "pure_nccl"), (3, "naive")]
    assert _names_compared(str(path), keys=False) == [(1, "pure_nccl")]
