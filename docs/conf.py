"""Sphinx configuration for mnpar's documentation (``make docs``).

The build runs with ``-W``: every warning fails it. It uses Sphinx's
built-in extensions and theme only. Parts of the package that other work
is still adding (``mnpar.functions``, ``mnpar.links``, ``mnpar.datasets``)
are documented through ``automodule-if-present``, which autodocs a module
once its file exists and shows a note until then, so the build never fails
on a module that is not written yet.
"""
import os
import re
import sys

from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, ROOT)  # autodoc imports the checkout, installed or not


def _version() -> str:
    with open(os.path.join(ROOT, "mnpar", "__init__.py"), encoding="utf-8") as f:
        match = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    return match.group(1) if match else "unknown"


project = "mnpar"
author = "the mnpar authors"
copyright = "the mnpar authors"
release = _version()
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build"]
highlight_language = "default"  # literal blocks: Python where it lexes, else plain

napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"

html_theme = "alabaster"
html_theme_options = {
    "description": "Model-parallel training for Chainer on MPI",
    "fixed_sidebar": True,
}
html_title = f"mnpar {release}"


def module_file(name: str):
    """The source file of module ``name`` in this checkout, or None if absent."""
    base = os.path.join(ROOT, *name.split("."))
    for path in (os.path.join(base, "__init__.py"), base + ".py"):
        if os.path.isfile(path):
            return path
    return None


class AutomoduleIfPresent(SphinxDirective):
    """``automodule`` for a module that may not exist yet.

    Takes autodoc's ``:members:`` and ``:undoc-members:`` flags, and a
    ``:summary:`` shown only while the module's file is absent, in a note
    that says so; until the file appears, the page is re-read on every build.
    """

    required_arguments = 1
    option_spec = {
        "members": directives.flag,
        "undoc-members": directives.flag,
        "summary": directives.unchanged,
    }

    def run(self):
        name = self.arguments[0]
        if module_file(name) is not None:
            flags = "".join(f"   :{flag}:\n" for flag in ("members", "undoc-members")
                            if flag in self.options)
            return self.parse_text_to_nodes(f".. automodule:: {name}\n{flags}")
        expected = os.path.join(ROOT, *name.split("."), "__init__.py")
        self.env.note_dependency(expected)  # a missing dependency keeps the page outdated
        summary = self.options.get("summary", "")
        return self.parse_text_to_nodes(
            f"{summary}\n\n.. note::\n\n   ``{name}`` is not in this checkout yet; this "
            "section is generated from its docstrings once the module exists.\n")


def setup(app):
    app.add_directive("automodule-if-present", AutomoduleIfPresent)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
