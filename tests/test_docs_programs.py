"""Every program in README.rst and docs/*.rst runs as written, and prints what the text shows.

The code blocks say what they are through an rST comment on the line before
the block (blank lines may come between; the comment shows nowhere in the
built pages)::

    .. program: train.py      the next code block is the complete program train.py
    .. output: train.py       the next code block is what train.py prints
    .. fragment:              the next code block is a piece of a program; it is not run

The rules this module checks:

* Every Python block (``.. code-block:: python``, ``.. code:: python``) is
  marked ``program`` or ``fragment``; an unmarked one fails the test, and so
  does a literal block (``::``) whose text compiles as Python: write it as a
  ``python`` code block and mark it. Blocks of other languages (``text``,
  ``console``, ``shell``) need no marker, except as an ``output``.
* Blocks marked with the same program name in one file are one program,
  joined in the order of the page (the text says to save them together).
* A program runs as its page says: the page names the command
  ``.venv/bin/mpiexec -n N .venv/bin/python NAME`` (or ``.venv/bin/python
  NAME`` for one process), and the program runs at every N so named, in an
  empty directory, offline (downloads fail at once, and chainer's and
  scikit-learn's data caches are empty folders), under a hard timeout; it
  must exit with status 0.
* Every program has one ``output`` block. Its lines must be consecutive lines
  of what the program prints (all ranks' standard output together), with
  every number free (any number matches any number, as losses and times
  vary), runs of spaces alike and chainer's terminal code ``ESC[J`` dropped;
  a line ``...`` stands for any number of lines.
* A fragment must compile, as a module or as a function's body (a fragment
  may ``return``).

The programs run once per session (cached); the checks of what they print
beyond the output block (a loss that fell, say) reuse that run.
"""
import functools
import glob
import os
import re
import signal
import subprocess
import sys
import textwrap
from typing import Dict, List, NamedTuple, Optional, Tuple

import pytest
from run_suite import ROOT, find_mpiexec

PAGES = ["README.rst"] + sorted(os.path.relpath(p, ROOT)
                                for p in glob.glob(os.path.join(ROOT, "docs", "*.rst")))
PYTHON = {"python", "python3", "py"}
TIMEOUT = 120  # seconds per program run; each takes 3-10 s on two busy cores

MARKER = re.compile(r"^(\s*)\.\. (program|output|fragment):[ \t]*(\S*)[ \t]*$")
DIRECTIVE = re.compile(r"^(\s*)\.\. (?:code-block|code|sourcecode)::[ \t]*(\S*)[ \t]*$")
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


class Block(NamedTuple):
    """A code block of a page: where it starts (1-based line), its language, its marker."""

    page: str
    line: int
    language: str  # '::' for a literal block
    text: str
    marker: Optional[Tuple[str, str]]  # (kind, name), or None


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip())


def parse(page: str, source: str) -> Tuple[List[Block], List[str]]:
    """The code blocks of an rST page, and the problems with its markers."""
    lines = source.split("\n")
    blocks: List[Block] = []
    problems: List[str] = []
    pending: Optional[Tuple[int, Tuple[str, str]]] = None
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.match(line)
        directive = DIRECTIVE.match(line)
        literal = (line.rstrip().endswith("::") and not line.lstrip().startswith(".. ")
                   and not directive)
        if marker:
            if pending:
                problems.append(f"{page}:{pending[0]}: marker not followed by a code block")
            kind, name = marker[2], marker[3]
            if (kind == "fragment") == bool(name):
                problems.append(f"{page}:{i + 1}: '{line.strip()}': a program or output "
                                "marker names the program; a fragment marker names nothing")
            pending = (i + 1, (kind, name))
            i += 1
            continue
        if not (directive or literal):
            if line.strip() and pending:
                problems.append(f"{page}:{pending[0]}: marker not followed by a code block")
                pending = None
            i += 1
            continue
        base = indent_of(line)
        j = i + 1
        if directive:  # options (:caption: ...) sit right under the directive
            while j < len(lines) and re.match(r"^\s+:[\w-]+:", lines[j]) \
                    and indent_of(lines[j]) > base:
                j += 1
        body: List[str] = []
        while j < len(lines) and (not lines[j].strip() or indent_of(lines[j]) > base):
            body.append(lines[j])
            j += 1
        language = directive[2] if directive else "::"
        if literal and pending:
            problems.append(f"{page}:{pending[0]}: a marked block must be a "
                            "'.. code-block::', not a literal block ('::')")
        blocks.append(Block(page, i + 1, language, textwrap.dedent("\n".join(body)).strip("\n")
                            + "\n", pending[1] if pending else None))
        pending = None
        i = j
    if pending:
        problems.append(f"{page}:{pending[0]}: marker not followed by a code block")
    return blocks, problems


def compiles(text: str) -> Optional[SyntaxError]:
    """None if ``text`` compiles as a module or as a function's body, else the first error."""
    try:
        compile(text, "<block>", "exec")
        return None
    except SyntaxError as error:
        try:
            compile("def _fragment():\n" + textwrap.indent(text, "    "), "<block>", "exec")
            return None
        except SyntaxError:
            return error


def check_blocks(blocks: List[Block]) -> List[str]:
    """What is wrong with the blocks' marking: one line per problem."""
    problems = []
    programs = {(b.page, b.marker[1]) for b in blocks if b.marker and b.marker[0] == "program"}
    outputs: Dict[Tuple[str, str], int] = {}
    for b in blocks:
        where = f"{b.page}:{b.line}"
        kind = b.marker[0] if b.marker else None
        if b.language == "::":
            if not compiles(b.text):
                problems.append(f"{where}: a literal block ('::') of Python code: write it as "
                                "'.. code-block:: python' and mark it as a program or fragment")
        elif b.language in PYTHON:
            if kind not in ("program", "fragment"):
                problems.append(f"{where}: a Python block marked neither '.. program: NAME' "
                                "nor '.. fragment:' (see tests/test_docs_programs.py)")
            elif kind == "fragment" and compiles(b.text):
                problems.append(f"{where}: the fragment does not compile: {compiles(b.text)}")
        elif kind in ("program", "fragment"):
            problems.append(f"{where}: a '{kind}' marker on a {b.language or 'plain'} block; "
                            "programs and fragments are Python")
        if kind == "output":
            key = (b.page, b.marker[1])
            outputs[key] = outputs.get(key, 0) + 1
            if key not in programs:
                problems.append(f"{where}: output of {b.marker[1]}, which {b.page} has no "
                                "program of")
    for page, name in sorted(programs):
        if outputs.get((page, name), 0) != 1:
            problems.append(f"{page}: the program {name} needs one '.. output: {name}' block "
                            f"(what it prints), not {outputs.get((page, name), 0)}")
    return problems


def launches(source: str, name: str) -> List[int]:
    """The rank counts the page runs ``name`` at: each inline literal or line of the page
    that is exactly ``.venv/bin/mpiexec -n N .venv/bin/python NAME`` (1 for ``.venv/bin/python
    NAME``), after a console prompt if any."""
    commands = [re.sub(r"\s+", " ", c) for c in re.findall(r"``(.+?)``", source, re.S)]
    commands += source.split("\n")
    command = re.compile(r"(?:\$ )?(?:\.venv/bin/mpiexec -n (\d+) )?\.venv/bin/python "
                         + re.escape(name))
    found = [command.fullmatch(c.strip()) for c in commands]
    return sorted({int(m[1] or 1) for m in found if m})


def expected_pattern(line: str) -> str:
    """A regular expression for one line of an output block: numbers free, spaces alike."""
    words = []
    for word in line.split():
        parts = re.split(f"({NUMBER})", word)
        words.append("".join(NUMBER if k % 2 else re.escape(part)
                             for k, part in enumerate(parts)))
    return r"^\s*" + r"\s+".join(words) + r"\s*$"


def matches(expected: str, printed: str) -> bool:
    """Whether ``expected`` (an output block) is a run of consecutive lines of ``printed``."""
    want = [ln for ln in expected.strip("\n").split("\n")]
    got = [ln.rstrip() for ln in printed.replace("\033[J", "").split("\n")]

    @functools.cache
    def from_here(w: int, g: int) -> bool:
        if w == len(want):
            return True
        if want[w].strip() == "...":
            return any(from_here(w + 1, k) for k in range(g, len(got) + 1))
        return (g < len(got) and re.match(expected_pattern(want[w]), got[g]) is not None
                and from_here(w + 1, g + 1))

    return any(from_here(0, g) for g in range(len(got)))


# -- the pages ------------------------------------------------------------------------


def read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


@functools.cache
def page_blocks(page: str) -> Tuple[List[Block], List[str]]:
    return parse(page, read(page))


def programs() -> List[Tuple[str, str, int]]:
    """``(page, program name, ranks)`` of every program, at every rank count its page names."""
    found = []
    for page in PAGES:
        blocks, _ = page_blocks(page)
        names = dict.fromkeys(b.marker[1] for b in blocks
                              if b.marker and b.marker[0] == "program")
        for name in names:
            for n in launches(read(page), name) or [0]:  # 0: the test says it is missing
                found.append((page, name, n))
    return found


def program_text(page: str, name: str) -> str:
    blocks, _ = page_blocks(page)
    return "\n".join(b.text for b in blocks if b.marker == ("program", name))


def output_text(page: str, name: str) -> str:
    blocks, _ = page_blocks(page)
    return next(b.text for b in blocks if b.marker == ("output", name))


def offline_env(data: str) -> Dict[str, str]:
    """This environment without MPI's launch variables, downloads failing at once."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "HYDRA_", "MPIR_", "OMPI_"))}
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens, a connect fails at once
    env.update(PYTHONUNBUFFERED="1", MNPAR_TIMEOUT="60", MPLBACKEND="Agg",
               http_proxy=dead, https_proxy=dead, HTTP_PROXY=dead, HTTPS_PROXY=dead,
               no_proxy="", NO_PROXY="", CHAINER_DATASET_ROOT=os.path.join(data, "chainer"),
               SCIKIT_LEARN_DATA=os.path.join(data, "scikit_learn"),
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in os.environ.get(
                   "PYTHONPATH", "").split(os.pathsep) if p]))
    return env


@functools.cache
def run_program(page: str, name: str, n: int, workdir: str) -> Tuple[int, str, str]:
    """``(exit status, stdout, stderr)`` of the program run as its page says; cached."""
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
        f.write(program_text(page, name))
    launcher = ([find_mpiexec(), *os.environ.get("MPIEXEC_FLAGS", "").split(), "-n", str(n)]
                if n > 1 else [])
    proc = subprocess.Popen([*launcher, sys.executable, name], cwd=workdir,
                            env=offline_env(os.path.join(workdir, "data")), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return -1, out, err + f"\n(killed after {TIMEOUT} s: a deadlock?)"
    return proc.returncode, out, err


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
    return str(tmp_path_factory.mktemp("docs-programs"))


def ran(workspace: str, page: str, name: str, n: int) -> str:
    """The program's standard output; fails the test unless it exited with 0."""
    where = os.path.join(workspace, page.replace("/", "_"), f"{name}-n{n}")
    code, out, err = run_program(page, name, n, where)
    assert code == 0, (f"{page}: {name} at {n} rank(s) exited with {code}\n--- stdout\n{out}"
                       f"\n--- stderr\n{err}")
    return out


# -- the tests ------------------------------------------------------------------------


def test_every_python_block_is_a_program_or_a_fragment():
    problems = []
    for page in PAGES:
        blocks, marker_problems = page_blocks(page)
        problems += marker_problems + check_blocks(blocks)
    assert not problems, "\n".join(problems)


def test_every_script_the_pages_launch_exists():
    # A command of a page that runs a file of the repository (examples/, benchmarks/,
    # tests/) names one that is there.
    missing = []
    for page in PAGES:
        for path in re.findall(r"bin/python (?:-\S+ (?:ignore )?)*((?:examples|benchmarks|"
                               r"tests)/[\w/.-]+\.py)\b", read(page)):
            if not os.path.isfile(os.path.join(ROOT, path)):
                missing.append(f"{page}: {path}")
    assert not missing, "\n".join(missing)


def test_the_pages_hold_programs():
    # The pages this issue made runnable; a marker lost in an edit shows here.
    found = {(page, name) for page, name, _ in programs()}
    for page, name in [("README.rst", "train.py"), ("docs/tutorial.rst", "train.py"),
                       ("docs/pipeline.rst", "loop.py"), ("docs/pipeline.rst", "chain.py"),
                       ("docs/data_parallel.rst", "train_data_parallel.py")]:
        assert (page, name) in found


@pytest.mark.slow
@pytest.mark.parametrize("page, name, n", programs(), ids=lambda v: str(v))
def test_the_program_runs_and_prints_what_its_page_shows(workspace, page, name, n):
    assert n, (f"{page} does not say how to run {name}: give the command "
               f"'.venv/bin/mpiexec -n N .venv/bin/python {name}'")
    out = ran(workspace, page, name, n)
    shown = output_text(page, name)
    assert matches(shown, out), (f"{page}: {name} at {n} rank(s) does not print what the page "
                                 f"shows\n--- the page\n{shown}\n--- printed\n{out}")


def last_row(out: str, column: str) -> float:
    """The value of ``column`` in the last row of a PrintReport table in ``out``."""
    lines = out.replace("\033[J", "").split("\n")
    header = max(i for i, ln in enumerate(lines) if column in ln.split())
    index = lines[header].split().index(column)
    rows = [ln.split() for ln in lines[header + 1:]
            if ln.split() and re.fullmatch(NUMBER, ln.split()[0])]
    return float(rows[-1][index])


@pytest.mark.slow
@pytest.mark.parametrize("page", ["README.rst", "docs/tutorial.rst"])
def test_the_quickstarts_learn(workspace, page):
    out = ran(workspace, page, "train.py", 2)
    assert last_row(out, "main/loss") < 1.0  # 10 classes: chance is 2.3


# -- the checker itself ---------------------------------------------------------------


PAGE = """\
Title
=====

Save it as ``run.py``, run ``.venv/bin/mpiexec -n 3
.venv/bin/python run.py``:

.. program: run.py

.. code-block:: python

   print("epoch 1 loss 0.5")

It prints:

.. output: run.py

.. code-block:: text

   epoch 2 loss 1e-3

.. fragment:

.. code-block:: python

   return x

A diagram::

   rank 0 -> rank 1
"""


def test_the_checker_accepts_a_marked_page():
    blocks, problems = parse("p.rst", PAGE)
    assert problems == [] and check_blocks(blocks) == []
    assert [b.marker for b in blocks] == [("program", "run.py"), ("output", "run.py"),
                                          ("fragment", ""), None]
    assert launches(PAGE, "run.py") == [3]
    assert launches("run ``.venv/bin/python run.py``", "run.py") == [1]
    assert launches("run ``.venv/bin/python run.py.bak``", "run.py") == []
    assert launches("   .venv/bin/mpiexec -f hosts -n 4 .venv/bin/python run.py", "run.py") == []
    assert launches("   $ .venv/bin/mpiexec -n 2 .venv/bin/python run.py\n", "run.py") == [2]


@pytest.mark.parametrize("edit, problem", [
    (("A diagram::", ".. code:: python\n\n   x = 1\n\nA diagram::"), "marked neither"),
    ((".. fragment:\n", ""), "marked neither"),
    (("A diagram::\n\n   rank 0 -> rank 1\n", "Code::\n\n   x = f(1)\n"), "literal block"),
    (("   return x\n", "   return x +\n"), "does not compile"),
    ((".. output: run.py\n", ""), "needs one '.. output: run.py'"),
    (("It prints:\n", ".. output: run.py\n\nIt prints:\n"), "marker not followed"),
    ((".. fragment:\n", ".. fragment: run.py\n"), "a fragment marker names nothing"),
    (("A diagram::", ".. fragment:\n\nA diagram::"), "not a literal block"),
])
def test_the_checker_refuses(edit, problem):
    old, new = edit
    assert old in PAGE
    page = PAGE.replace(old, new, 1)
    blocks, problems = parse("p.rst", page)
    problems += check_blocks(blocks)
    assert any(problem in p for p in problems), problems


def test_an_output_block_matches_numbers_freely_and_in_order():
    printed = ("header\n\033[Jepoch  main/loss\n1      2.3025\n2      0.51\n3      1.5e-05\n"
               "done in 3.2 s\n")
    assert matches("epoch  main/loss\n1  0.9\n...\ndone in 1 s\n", printed)
    assert matches("2 0.51\n3 0.1", printed)
    assert not matches("epoch  main/loss\ndone in 1 s\n", printed)  # lines skipped, no ...
    assert not matches("epoch  main/accuracy\n", printed)
    assert not matches("1  2.3  7\n", printed)  # one number too many
    assert not matches("done in s\n", printed)


def test_a_program_that_fails_or_downloads_fails_the_test(tmp_path, monkeypatch):
    page = PAGE.replace('print("epoch 1 loss 0.5")',
                        'import urllib.request\n   urllib.request.urlopen("http://example.com")')
    (tmp_path / "p.rst").write_text(page)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    page_blocks.cache_clear()
    try:
        code, out, err = run_program("p.rst", "run.py", 1, str(tmp_path / "run"))
    finally:
        page_blocks.cache_clear()
    assert code != 0 and re.search(r"URLError|ProxyError|Connection refused", err), err
