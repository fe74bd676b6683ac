"""Sphinx configuration for mnpar's documentation (``make docs``).

The build runs with ``-W``: every warning fails it. It uses Sphinx's
built-in extensions and theme only. Parts of the package that other work
is still adding (``mnpar.functions``, ``mnpar.links``, ``mnpar.datasets``)
are documented through ``automodule-if-present``, which autodocs a module
once its file exists and shows a note until then, so the build never fails
on a module that is not written yet.

Lists of names and values that live in the code are read from it at build
time, so the pages cannot fall behind it: the role ``:value:`mnpar.X.NAME```
shows an attribute's ``repr`` (``mnpar.pipeline.SCHEDULES``), and the
directive ``.. mnpar-errors::`` tabulates every exception and warning that
mnpar and its subpackages export, documenting those of the top level.
"""
import importlib
import inspect
import os
import re
import sys
from typing import Dict, List

from docutils import nodes
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


def value_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """``:value:`mnpar.pipeline.SCHEDULES```: the attribute's ``repr``, read at build time."""
    module, _, attribute = text.rpartition(".")
    try:
        shown = repr(getattr(importlib.import_module(module), attribute))
    except (ImportError, AttributeError, ValueError) as error:
        message = inliner.reporter.error(f":value:`{text}`: {error}", line=lineno)
        return [inliner.problematic(rawtext, rawtext, message)], [message]
    return [nodes.literal(rawtext, shown)], []


def public_exceptions() -> Dict[type, List[str]]:
    """Every exception and warning class in the ``__all__`` of mnpar and of its
    subpackages, with the public names it is exported under (the top level's first)."""
    import mnpar

    found: Dict[type, List[str]] = {}
    modules = ["mnpar"] + [f"mnpar.{name}" for name in mnpar.__all__
                           if inspect.ismodule(getattr(mnpar, name))]
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, Exception):
                found.setdefault(obj, []).append(f"{module_name}.{name}")
    return found


class MnparErrors(SphinxDirective):
    """``.. mnpar-errors::``: a table of mnpar's exceptions and warnings, then those
    only the top level exports, documented (a subpackage's are, with its module)."""

    def run(self):
        found = public_exceptions()
        rows: List[str] = []
        for cls, names in sorted(found.items(), key=lambda item: item[1][0]):
            base = cls.__bases__[0]
            base_name = found[base][0] if base in found else base.__name__
            summary = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
            rows += [f"   * - :exc:`{names[0]}`", f"     - ``{base_name}``", f"     - {summary}"]
        text = (".. list-table::\n   :header-rows: 1\n   :widths: 30 20 50\n\n"
                "   * - name\n     - derives from\n     - what it means\n" + "\n".join(rows)
                + "\n\n")
        text += "".join(f".. autoexception:: {names[0]}\n\n"
                        for names in sorted(found.values())
                        if all(name.count(".") == 1 for name in names))
        return self.parse_text_to_nodes(text)


def setup(app):
    app.add_directive("automodule-if-present", AutomoduleIfPresent)
    app.add_directive("mnpar-errors", MnparErrors)
    app.add_role("value", value_role)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
