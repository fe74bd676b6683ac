"""mnpar's import layers, checked from the source: DESIGN.md's order and no cycles.

Every module under ``mnpar/`` is parsed with ``ast`` (nothing is imported, no
MPI), relative imports are resolved, and each import of one of mnpar's own
modules becomes an edge ``importer -> imported``, imports inside functions
included (marked ``in a function``). ``from pkg import name`` is an edge to
``pkg.name`` where that is a module, else to ``pkg`` itself.

Four rules:

- No cycle between mnpar's modules. A module importing its own package's
  ``__init__`` (whose re-exports import that module) is not counted.
- A module imports only from its own layer and the layers below it in
  ``BELOW``: the model-parallel stack bottom up, and the trainer glue beside
  it (a layer reaches everything below the ones it names)::

      layer          modules                                   directly below
      top            mnpar/__init__.py                         every layer
      iterators      mnpar/iterators/                          extensions
      extensions     mnpar/extensions/                         communicators, checkpoint
      checkpoint     mnpar/checkpoint/                         optimizers
      optimizers     mnpar/optimizers/                         communicators
      optimizer_hooks mnpar/optimizer_hooks/                   communicators
      datasets       mnpar/datasets/                           communicators
      pipeline       mnpar/pipeline/                           links, random
      spatial        mnpar/spatial/                            functions, random
      links          mnpar/links/                              functions
      random         mnpar/random/                             communicators
      tensor         mnpar/tensor/                             functions, random, _mesh
      _mesh          mnpar/_mesh.py                            communicators
      functions      mnpar/functions/                          communicators
      communicators  mnpar/communicators/                      base
      base           mnpar/_arrays, _errors, _failfast,        -
                     global_except_hook, _marks, _nodes

  Only ``top`` and the glue itself import the glue: the model-parallel stack
  never depends on the trainer, and the glue needs the communicator only,
  not the differentiable functions. ``iterators`` sits on ``extensions`` because
  the synchronized iterator shuffles with the resumable order sampler.
- Inside ``mnpar/spatial/`` its three parts stand in order (``PARTS``):
  ``traffic`` (with the package's shared modules ``_errors`` and ``_marks``)
  imports neither ``operations`` nor ``guard``, and ``operations`` does not
  import ``guard``; the package's other modules (``__init__``, ``_dataset``)
  import any part.
- Outside ``mnpar/communicators/`` a module imports the package
  (``mnpar.communicators``, its public names) or its one internal facade
  (``mnpar.communicators._facade``), never another of its private modules:
  what other layers use of the transport is listed in one place.
"""
import ast
import os
from typing import Dict, List, NamedTuple, Set, Tuple

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mnpar")

FACADES = {"mnpar.communicators": "mnpar.communicators._facade"}
# A package's parts (sub-packages) bottom up, and its modules that sit beside the first.
PARTS = {"mnpar.spatial": (("traffic", "operations", "guard"), ("_errors", "_marks"))}
BASE = {"mnpar._arrays", "mnpar._errors", "mnpar._failfast", "mnpar.global_except_hook",
        "mnpar._marks", "mnpar._nodes"}

# Each layer and the layers directly below it; a layer may import itself and
# everything it reaches through this table.
BELOW: Dict[str, Tuple[str, ...]] = {
    "base": (),
    "communicators": ("base",),
    "functions": ("communicators",),
    "links": ("functions",),
    "spatial": ("functions", "random"),
    "pipeline": ("links", "random"),
    "random": ("communicators",),
    "tensor": ("functions", "random", "_mesh"),
    "_mesh": ("communicators",),
    "datasets": ("communicators",),
    "optimizers": ("communicators",),
    "optimizer_hooks": ("communicators",),
    "extensions": ("communicators", "checkpoint"),
    "checkpoint": ("optimizers",),
    "iterators": ("extensions",),
}


def _reach(layer: str) -> Set[str]:
    seen = {layer}
    for lower in BELOW[layer]:
        seen |= _reach(lower)
    return seen


ALLOWED: Dict[str, Set[str]] = {layer: _reach(layer) for layer in BELOW}
ALLOWED["top"] = set(BELOW) | {"top"}


class Import(NamedTuple):
    path: str  # relative to the folder holding mnpar/
    line: int
    importer: str
    imported: str
    deferred: bool  # inside a function: runs at call time, not at import

    def __str__(self) -> str:
        where = " (in a function)" if self.deferred else ""
        return f"{self.path}:{self.line}: {self.importer} -> {self.imported}{where}"


def modules(root: str) -> Dict[str, Tuple[str, bool]]:
    """Every module under the package folder ``root``: name -> (path, is a package)."""
    found = {}
    top = os.path.dirname(root)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for file in sorted(files):
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            parts = os.path.relpath(path, top)[:-3].split(os.sep)
            package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


class _Collector(ast.NodeVisitor):
    """The imports of one module, each with its line and whether a function holds it."""

    def __init__(self) -> None:
        self.found: List[Tuple[int, str, List[str], int, bool]] = []
        self.depth = 0

    def visit_FunctionDef(self, node) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((node.lineno, alias.name, [], 0, self.depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        names = [alias.name for alias in node.names]
        self.found.append((node.lineno, node.module or "", names, node.level, self.depth > 0))


def imports(root: str) -> List[Import]:
    """Every import of one of the package's own modules by another, in file order."""
    mods = modules(root)
    top = os.path.dirname(root)
    edges = []
    for name, (path, package) in mods.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        collector = _Collector()
        collector.visit(tree)
        here = name if package else name.rpartition(".")[0]
        for line, module, names, level, deferred in collector.found:
            if level:
                parts = here.split(".")
                base = ".".join(parts[:len(parts) - level + 1])
                module = f"{base}.{module}" if module else base
            targets = [f"{module}.{n}" if f"{module}.{n}" in mods else module for n in names]
            for target in dict.fromkeys(targets or [module]):
                while target not in mods and "." in target:  # import a.b.c of a.b's name c
                    target = target.rpartition(".")[0]
                if target in mods and target != name:
                    edges.append(Import(os.path.relpath(path, top), line, name, target, deferred))
    return edges


def layer_of(module: str) -> str:
    if module == "mnpar":
        return "top"
    if module in BASE:
        return "base"
    return module.split(".")[1]


def layer_violations(edges: List[Import]) -> List[str]:
    """Each import of a layer its importer may not use, as ``file:line: a -> b (why)``."""
    bad = []
    for edge in edges:
        mine, theirs = layer_of(edge.importer), layer_of(edge.imported)
        if theirs not in ALLOWED.get(mine, ()):
            bad.append(f"{edge}: layer {mine} may not import layer {theirs}")
    return bad


def _part(module: str, package: str) -> int:
    """Where ``module`` of ``package`` stands among its ``PARTS``: the index of its part
    (a shared module: 0), or past them all (the package's other modules)."""
    parts, shared = PARTS[package]
    name = module[len(package) + 1:].split(".")[0]
    if name in parts:
        return parts.index(name)
    return 0 if name in shared else len(parts)


def part_violations(edges: List[Import]) -> List[str]:
    """Each import of a later part of a package of ``PARTS`` by an earlier one."""
    bad = []
    for edge in edges:
        for package, (parts, _) in PARTS.items():
            if not (edge.importer.startswith(package + ".")
                    and edge.imported.startswith(package + ".")):
                continue
            mine, theirs = _part(edge.importer, package), _part(edge.imported, package)
            if theirs > mine:
                bad.append(f"{edge}: {package}'s part {parts[mine]} may not import "
                           f"{parts[theirs] if theirs < len(parts) else 'the package'}")
    return bad


def private_imports(edges: List[Import]) -> List[str]:
    """Each import, from outside a package of ``FACADES``, of one of its private modules
    other than its facade, as ``file:line: a -> b (why)``."""
    bad = []
    for edge in edges:
        for package, facade in FACADES.items():
            inside = edge.importer == package or edge.importer.startswith(package + ".")
            name = edge.imported[len(package) + 1:].split(".")[0]
            if not inside and edge.imported.startswith(package + "._") and \
                    edge.imported != facade and name.startswith("_"):
                bad.append(f"{edge}: import it from {facade} (or {package})")
    return bad


def cycles(edges: List[Import]) -> List[List[Import]]:
    """One cycle through each group of modules that import each other, as its edges."""
    graph: Dict[str, List[Import]] = {}
    for edge in edges:
        if edge.importer.startswith(edge.imported + "."):
            continue  # its own package's __init__, which re-exports it
        graph.setdefault(edge.importer, []).append(edge)
    found = []
    for group in _strongly_connected(graph):
        # The shortest way from the group's first module back to itself.
        start = min(group)
        ways: Dict[str, List[Import]] = {start: []}
        queue = [start]
        while queue:
            node = queue.pop(0)
            for edge in graph.get(node, []):
                if edge.imported == start:
                    found.append(ways[node] + [edge])
                    queue = []
                    break
                if edge.imported in group and edge.imported not in ways:
                    ways[edge.imported] = ways[node] + [edge]
                    queue.append(edge.imported)
    return found


def _strongly_connected(graph: Dict[str, List[Import]]) -> List[Set[str]]:
    """Tarjan's groups of two or more modules, each reachable from every other."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    groups = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for edge in graph.get(node, []):
            nxt = edge.imported
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups, key=min)


def describe(cycle: List[Import]) -> str:
    return "\n  ".join(["import cycle:"] + [str(edge) for edge in cycle])


@pytest.fixture(scope="module")
def edges():
    return imports(ROOT)


def test_every_module_has_a_layer():
    unplaced = sorted({m for m in modules(ROOT) if layer_of(m) not in ALLOWED})
    if unplaced:
        pytest.fail(f"{unplaced}: give their package a row in BELOW (tests/test_layers.py)",
                    pytrace=False)


def test_no_import_cycles(edges):
    found = cycles(edges)
    if found:
        pytest.fail("\n".join(describe(c) for c in found), pytrace=False)


def test_each_layer_imports_only_from_itself_and_below(edges):
    bad = layer_violations(edges)
    if bad:
        pytest.fail("imports against DESIGN.md's layers:\n" + "\n".join(bad), pytrace=False)


def test_spatials_parts_import_only_the_parts_before_them(edges):
    bad = part_violations(edges)
    if bad:
        pytest.fail("imports against spatial's parts:\n" + "\n".join(bad), pytrace=False)


def test_other_layers_reach_the_communicators_through_their_facade(edges):
    bad = private_imports(edges)
    if bad:
        pytest.fail("private modules of communicators imported from outside:\n"
                    + "\n".join(bad), pytrace=False)


# -- the check itself, on a made-up package --------------------------------------


def write(root, files):
    for path, text in files.items():
        full = root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)


def test_the_check_names_an_upward_import_and_a_cycle(tmp_path):
    write(tmp_path, {
        "mnpar/__init__.py": "from . import communicators, links\n",
        "mnpar/_errors.py": "",
        "mnpar/communicators/__init__.py": "from ._comm import Comm\n",
        "mnpar/communicators/_comm.py": (
            "from .._errors import X\n"
            "def f():\n"
            "    from ..links import _chain\n"),
        "mnpar/links/__init__.py": "from ._chain import Chain\nfrom . import _wiring\n",
        "mnpar/links/_chain.py": "from . import _wiring\nfrom .._errors import X\n",
        "mnpar/links/_wiring.py": "import mnpar.links._chain\nfrom mnpar.links import Chain\n",
    })
    edges = imports(str(tmp_path / "mnpar"))
    assert layer_violations(edges) == [
        "mnpar/communicators/_comm.py:3: mnpar.communicators._comm -> mnpar.links._chain "
        "(in a function): layer communicators may not import layer links"]
    found = cycles(edges)
    assert [[(e.importer, e.imported) for e in c] for c in found] == [
        [("mnpar.links._chain", "mnpar.links._wiring"),
         ("mnpar.links._wiring", "mnpar.links._chain")]]
    assert "mnpar/links/_wiring.py:1: mnpar.links._wiring -> mnpar.links._chain" in (
        describe(found[0]))


def test_the_check_names_a_private_import_past_the_facade(tmp_path):
    write(tmp_path, {
        "mnpar/__init__.py": "",
        "mnpar/communicators/__init__.py": "from ._comm import Comm\n",
        "mnpar/communicators/_comm.py": "from ._wait import wait\n",
        "mnpar/communicators/_wait.py": "",
        "mnpar/communicators/_facade.py": "from ._comm import Comm\nfrom ._wait import wait\n",
        "mnpar/links/__init__.py": "",
        "mnpar/links/_chain.py": (
            "from ..communicators import Comm\n"
            "from ..communicators._facade import wait\n"
            "from ..communicators._wait import wait\n"
            "from ..communicators import _comm\n"),
    })
    edges = imports(str(tmp_path / "mnpar"))
    assert private_imports(edges) == [
        "mnpar/links/_chain.py:3: mnpar.links._chain -> mnpar.communicators._wait: import it "
        "from mnpar.communicators._facade (or mnpar.communicators)",
        "mnpar/links/_chain.py:4: mnpar.links._chain -> mnpar.communicators._comm: import it "
        "from mnpar.communicators._facade (or mnpar.communicators)"]


def test_the_check_names_a_part_importing_a_later_one(tmp_path):
    write(tmp_path, {
        "mnpar/__init__.py": "",
        "mnpar/spatial/__init__.py": "from .guard._convert import convert\n",
        "mnpar/spatial/_marks.py": "from .traffic._grid import Grid\n",
        "mnpar/spatial/_dataset.py": "from .guard._checks import digest\n",
        "mnpar/spatial/traffic/__init__.py": "",
        "mnpar/spatial/traffic/_grid.py": "",
        "mnpar/spatial/traffic/_halo.py": "from .._marks import mark\n"
                                          "from ..operations._windowed import conv\n",
        "mnpar/spatial/operations/__init__.py": "",
        "mnpar/spatial/operations/_windowed.py": "from ..traffic._halo import Exchange\n",
        "mnpar/spatial/guard/__init__.py": "",
        "mnpar/spatial/guard/_checks.py": "",
        "mnpar/spatial/guard/_convert.py": "from ..operations._windowed import conv\n",
    })
    assert part_violations(imports(str(tmp_path / "mnpar"))) == [
        "mnpar/spatial/traffic/_halo.py:2: mnpar.spatial.traffic._halo -> "
        "mnpar.spatial.operations._windowed: mnpar.spatial's part traffic may not import "
        "operations"]
