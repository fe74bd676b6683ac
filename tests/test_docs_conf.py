"""docs/conf.py reads the lists docs/api.rst shows from the code (``make docs`` builds them)."""
import importlib.util
import os

import pytest
from run_suite import ROOT

import mnpar
import mnpar._errors


@pytest.fixture(scope="module")
def conf():
    spec = importlib.util.spec_from_file_location("docs_conf", os.path.join(ROOT, "docs",
                                                                            "conf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Inliner:
    """What a role needs of docutils' inliner: an error reporter and a 'problematic' node."""

    class reporter:
        @staticmethod
        def error(message, line):
            return message

    @staticmethod
    def problematic(rawtext, text, message):
        return ("problematic", message)


def test_the_value_role_shows_what_the_code_holds(conf):
    nodes, messages = conf.value_role("value", "", "mnpar.pipeline.SCHEDULES", 1, Inliner())
    assert nodes[0].astext() == repr(mnpar.pipeline.SCHEDULES) and not messages
    assert "zb1" in nodes[0].astext()


def test_the_value_role_fails_the_build_on_a_name_the_code_lacks(conf):
    nodes, messages = conf.value_role("value", "", "mnpar.pipeline.NO_SUCH", 1, Inliner())
    assert messages and "NO_SUCH" in messages[0]


def test_every_exported_error_is_in_the_table(conf):
    found = conf.public_exceptions()
    names = {names[0] for names in found.values()}
    for name in ("CommunicationTimeout", "PeerLost", "WiringError", "DataSizeError"):
        assert getattr(mnpar._errors, name) in found and f"mnpar.{name}" in names
    assert {"mnpar.pipeline.ScheduleError", "mnpar.spatial.GeometryError",
            "mnpar.pipeline.PipelineWarning"} <= names
    assert found[mnpar.DataSizeError] == ["mnpar.DataSizeError", "mnpar.datasets.DataSizeError"]
