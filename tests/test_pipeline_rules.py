"""The schedules' rule table: every schedule one row, checked at import; nothing else names one."""
import ast
import glob
import os

import pytest

from mnpar.pipeline import SCHEDULES, Graph, _rules, plan
from mnpar.pipeline._rules import (
    RULES,
    SPLIT_SCHEDULES,
    TRAINING_SCHEDULES,
    InFlight,
    Rule,
    rule_of,
    split_components,
)

CHAIN4 = {0: [(None, (1,))], 1: [((0,), (2,))], 2: [((1,), (3,))], 3: [((2,), None)]}


def test_the_names_come_from_the_table_in_its_order():
    assert SCHEDULES == ("gpipe", "1f1b", "zb1", "zb2", "forward")
    assert TRAINING_SCHEDULES == ("gpipe", "1f1b", "zb1", "zb2")
    assert SPLIT_SCHEDULES == ("zb1", "zb2")
    assert [rule.name for rule in RULES] == list(SCHEDULES)


def test_the_rows_say_what_the_schedules_do():
    assert rule_of("gpipe").forwards_first and rule_of("gpipe").in_flight is None
    assert rule_of("1f1b").in_flight == rule_of("zb1").in_flight == InFlight(1)
    assert not rule_of("1f1b").splits and rule_of("zb1").splits
    assert not rule_of("forward").trains
    stages = 4
    assert [InFlight(1).limits(stages, d) for d in range(4)] == [(4, 4), (3, 4), (2, 4), (1, 4)]
    assert [InFlight(2).limits(stages, d) for d in range(4)] == [(7, 7), (5, 7), (3, 7), (1, 7)]


def test_an_unknown_name_is_an_error_not_a_fallback():
    with pytest.raises(ValueError, match=r"schedule='zigzag' is not one of \('gpipe',"):
        rule_of("zigzag")
    with pytest.raises(ValueError, match="schedule='zigzag' is not one of"):
        split_components(Graph(CHAIN4), "zigzag")


@pytest.mark.parametrize("fields, match", [
    (dict(phases="FWB"), r"phases='FWB' is not one of \('F', 'FB', 'FBW'\)"),
    (dict(phases="FB", backward_order="newest"), "backward_order='newest' is not one of"),
    (dict(phases="FB", in_flight=InFlight(1), forwards_first=True),
     "forwards_first keeps every micro-batch"),
    (dict(phases="F", in_flight=InFlight(1)), "a forward-only rule keeps nothing"),
    (dict(phases="FB", in_flight=InFlight(0)),
     r"in_flight=InFlight\(factor=0\) is not an InFlight of factor >= 1"),
    (dict(phases="FB", in_flight=3), "in_flight=3 is not an InFlight"),
])
def test_a_half_made_rule_fails_where_it_is_written(fields, match):
    # Rules are built when _rules is imported: a bad row stops the import.
    with pytest.raises(ValueError, match=f"schedule rule 'zb3': {match}"):
        Rule("zb3", **fields)


def test_a_name_twice_in_the_table_fails():
    with pytest.raises(ValueError, match="schedule rule 'zb1' is in the table twice"):
        _rules._index(RULES + (Rule("zb1", "FBW", InFlight(3)),))


def test_a_new_schedule_is_one_row(monkeypatch):
    # ZB-H1's rule with three times 1F1B's micro-batches in flight: nothing but the row.
    monkeypatch.setitem(_rules.RULES_BY_NAME, "zb3", Rule("zb3", "FBW", InFlight(3)))
    graph = Graph(CHAIN4)
    zb3, zb1 = plan(graph, 8, "zb3"), plan(graph, 8, "zb1")
    assert zb3.split == zb1.split == {(1, 0), (2, 0), (3, 0)}
    assert zb3.makespan == zb1.makespan == 3 * 8 + 4 - 1
    assert max(zb3.peak_activations.values()) <= 3 * 4 - 2


def _names_compared(path):
    """(line, name) of each schedule name a module compares a value with or keys a dict by."""
    found = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Compare):
            operands = [node.left] + node.comparators
        elif isinstance(node, ast.Dict):
            operands = [k for k in node.keys if k is not None]
        else:
            continue
        for operand in operands:
            items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [
                operand]
            found += [(node.lineno, item.value) for item in items
                      if isinstance(item, ast.Constant) and item.value in SCHEDULES]
    return found


def test_no_module_but_the_table_chooses_a_schedule_by_its_name():
    # Regression: _schedule.py once had `if kind == "gpipe"` and `{"zb1": ...}.get(kind, 1f1b's)`,
    # so a schedule added to SCHEDULES without its branch ran silently as 1F1B.
    folder = os.path.dirname(_rules.__file__)
    offenders = {os.path.basename(path): _names_compared(path)
                 for path in glob.glob(os.path.join(folder, "*.py"))
                 if os.path.basename(path) != "_rules.py"}
    assert {name: found for name, found in offenders.items() if found} == {}
    assert _names_compared(os.path.join(folder, "_rules.py")) == []  # even there: rows only
