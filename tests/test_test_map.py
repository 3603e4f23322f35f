"""TESTS.md, the map from every module of sandbox/ and mcp_server/ to its tests, stays true.

The map lists each module under its package, and under each module the test files that
cover it, one line each on what they show.  A listed test covers its module only if it
can be seen to, read from the sources (``ast``), not taken on trust:

- **imports**: it imports the module (``import a.b``, ``from a import b``, ``from a.b
  import x``), at any depth, in its own code or in the Python source of a script it
  runs (a string constant that parses and imports, as ``python -c SCRIPT`` and scripts
  run as another user are written);
- **runs**: it runs the module as a program: ``-m a.b`` (a list ``[..., "-m", "a.b"]``, a
  string that is the module's full name, as a parametrized ``-m`` takes it, or
  ``-m a.b`` in a command string), or an entry point of pyproject.toml's
  ``[project.scripts]`` named in a string (``"ccw-mcp"``: ``mcp_server.__main__``) or as
  a path (``.venv/bin/ccw``).

A file's name is no evidence: ``test_sandbox_gitdirs.py`` is named for both
``sandbox/gitdirs.py`` and, by prefix, ``sandbox/__main__.py``, and tests only the first.

The helpers a test imports from ``tests.support`` (and ``tests.fuzz``) count as part of
it: a test that starts ``ccw-mcp`` through ``tests.support.mcp_process`` runs it.  For
"(end to end)" below, so does its suite's conftest.py (the fixtures it uses).

A test line marked "(end to end)" is a test that exercises the module only through
others (``CapsuleManager.exec`` runs ``sandbox/execution.py``): it must reach it through
what it imports or runs, the modules' own imports followed.  A module marked "(end to
end only)" has only such tests, and the mark must go once a test covers it directly.

Every module and every test file is in the map (a new one is placed on purpose); an
``__init__.py`` that defines no function or class is not a module to test.

No test module imports another (``from test_x import ...``, ``from tests.test_x import
...``, in its own code or in a script it runs), nor does a conftest.py or a support
module: what tests share lives in ``tests/support``, so a test file is read, run and
moved alone.
"""

from __future__ import annotations

import ast
import itertools
import re
import textwrap
import tomllib
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "TESTS.md"
PACKAGES = ("sandbox", "mcp_server")
SUITES = ("tests", "vm-tests")
HELPER_PACKAGES = ("tests.support", "tests.fuzz")
E2E_MARK = "(end to end only)"  # on a module: all its tests are end to end
E2E_TEST_MARK = "(end to end)"  # on one test under a module
WHOLE_HEADING = "## Tests of the whole"

# The map's lines: a package heading, a module, a test under it, a test of the whole code.
PACKAGE_LINE = re.compile(r"^#{2,3} `((?:sandbox|mcp_server)(?:/\w+)*)/`")
MODULE_LINE = re.compile(r"^- `(\w+\.py)` — \S")
TEST_LINE = re.compile(r"^  - `((?:tests|vm-tests)/test_\w+\.py)` — \S")
WHOLE_LINE = re.compile(r"^- `((?:tests|vm-tests)/test_\w+\.py)` — \S")
MINUS_M = re.compile(r"(?:^|\s)-m\s+([A-Za-z_][\w.]*)")


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _defines_something(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for node in tree.body)


@cache
def project_modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name; an ``__init__.py`` that defines no
    function or class (a docstring, a version) is not a module to test."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "__init__.py" or _defines_something(path):
                found[_dotted(path)] = path
    return found


@cache
def _all_names() -> frozenset[str]:
    """Dotted names of every module and package, tests' helpers included."""
    names = {_dotted(path) for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    names |= {_dotted(path) for package in HELPER_PACKAGES
              for path in (ROOT / package.replace(".", "/")).rglob("*.py")}
    return frozenset(names)


@cache
def _entry_points() -> dict[str, str]:
    """``[project.scripts]``: script name -> the module it runs."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return {name: target.split(":")[0] for name, target in scripts.items()}


def _imports(tree: ast.AST) -> set[str]:
    """The dotted names an AST imports (``from a import b``: both ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _script_imports(text: str) -> set[str]:
    """What a string constant imports if it is Python source (a script run as a subprocess)."""
    parsed = _parsed(text) if "import" in text else None
    return _imports(parsed) if parsed is not None else set()


def _parsed(text: str) -> ast.AST | None:
    """``text`` parsed as Python, or None if it is not Python (a script may be indented
    where it is written, and dedented before it runs)."""
    try:
        return ast.parse(textwrap.dedent(text))
    except (SyntaxError, ValueError):
        return None


def _strings(tree: ast.AST) -> list[str]:
    """The string constants of a source that are values, not docstrings or bare comments;
    an f-string with each placeholder as ``_`` (a script that takes a test's paths)."""
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found = [node.value for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose]
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            found.append("".join(part.value if isinstance(part, ast.Constant) else "_" for part in node.values))
    return found


def _runs(tree: ast.AST) -> set[str]:
    """Modules run as programs: ``-m NAME`` in a list or a command string, entry points by name."""
    names: set[str] = set()
    scripts = _entry_points()
    for text in _strings(tree):
        names |= set(MINUS_M.findall(text))
        # "ccw-mcp", ".venv/bin/ccw"; a bare "ccw" is too common a word (a hostname) to count.
        names |= {module for script, module in scripts.items()
                  if (text == script and "-" in script) or text.endswith(f"/bin/{script}")}
    for node in ast.walk(tree):
        # ROOT / ".venv" / "bin" / "ccw"
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
                and node.right.value in scripts and isinstance(node.left, ast.BinOp)
                and isinstance(node.left.right, ast.Constant) and node.left.right.value == "bin"):
            names.add(scripts[str(node.right.value)])
        if isinstance(node, ast.List | ast.Tuple):
            items = [item.value if isinstance(item, ast.Constant) else None for item in node.elts]
            names |= {str(after) for before, after in itertools.pairwise(items)
                      if before == "-m" and isinstance(after, str)}
    # ``-m pkg`` runs pkg/__main__.py.
    return names | {f"{name}.__main__" for name in names}


@cache
def reaches(path: Path) -> frozenset[str]:
    """The known modules one source file imports or runs, its scripts' imports included."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    names = _imports(tree) | _runs(tree)
    for text in _strings(tree):
        # A script's imports; a module named in full (importlib.import_module of a name
        # written out, as the tool registry does; a test's parametrized ``-m`` modules).
        names |= _script_imports(text) | {text}
    return frozenset(names & _all_names())


def _helper_path(name: str) -> Path:
    base = ROOT / name.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


@cache
def direct_reach(path: Path) -> frozenset[str]:
    """What a test file reaches directly: its own imports and runs, and its helpers'."""
    seen: set[str] = set(reaches(path))
    helpers = [name for name in seen if name.startswith(HELPER_PACKAGES)]
    done: set[str] = set()
    while helpers:
        name = helpers.pop()
        if name in done or not _helper_path(name).exists():
            continue
        done.add(name)
        more = reaches(_helper_path(name))
        helpers += [found for found in more if found.startswith(HELPER_PACKAGES)]
        seen |= more
    return frozenset(seen & set(project_modules()))


def covers(module: str, test: Path) -> bool:
    """The test file imports the module or runs it (this file names modules as data, and
    covers none)."""
    return test != Path(__file__).resolve() and module in direct_reach(test)


@cache
def _graph_closure(start: frozenset[str]) -> frozenset[str]:
    """``start`` and every module they import or run, followed."""
    modules = project_modules()
    seen, todo = set(start), list(start)
    while todo:
        path = modules.get(todo.pop())
        for name in (reaches(path) & set(modules)) - seen if path else ():
            seen.add(name)
            todo.append(name)
    return frozenset(seen)


def reaches_end_to_end(module: str, test: Path) -> bool:
    """The module runs when the test's own imports and programs run, or its suite's
    conftest.py's (the fixtures: vm-tests' ``tools`` calls every tool in process)."""
    conftest = test.parent / "conftest.py"
    fixtures = reaches(conftest) & set(project_modules()) if conftest.is_file() else frozenset()
    return module in _graph_closure(direct_reach(test) | fixtures)


def imported_test_modules(tree: ast.AST) -> set[str]:
    """The test modules a source imports, its scripts' imports included: ``test_x`` (a
    suite's directory on the path), ``tests.test_x``, ``from tests import test_x``."""
    sources = [tree, *(parsed for text in _strings(tree) if "import" in text
                       if (parsed := _parsed(text)) is not None)]
    names: set[str] = set()
    for source in sources:
        for node in ast.walk(source):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                if node.module in SUITES:
                    names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in names
            if name.split(".")[-1].startswith("test_") and name.split(".")[0] in ("tests", name)}


def suite_files() -> list[Path]:
    return sorted(path for suite in SUITES for path in (ROOT / suite).glob("test_*.py"))


class MapFile:
    """TESTS.md as read: modules (dotted) with their tests, the e2e-only marks, the whole's tests."""

    def __init__(self, text: str) -> None:
        self.tests: dict[str, list[str]] = {}
        self.end_to_end: set[str] = set()
        self.e2e_pairs: set[tuple[str, str]] = set()
        self.whole: list[str] = []
        self.misplaced: list[str] = []
        package = module = None
        in_whole = False  # under the "Tests of the whole" heading
        for number, line in enumerate(text.splitlines(), 1):
            if found := PACKAGE_LINE.match(line):
                package, module, in_whole = found[1].replace("/", "."), None, False
            elif line.startswith("## "):
                package = module = None
                in_whole = line.startswith(WHOLE_HEADING)
            elif not package and not in_whole:
                continue  # the prose before the map
            elif (found := MODULE_LINE.match(line)) and package:
                stem = found[1].removesuffix(".py")
                module = package if stem == "__init__" else f"{package}.{stem}"
                if module in self.tests:
                    self.misplaced.append(f"line {number}: {module} is listed twice")
                self.tests[module] = []
                if E2E_MARK in line:
                    self.end_to_end.add(module)
            elif (found := TEST_LINE.match(line)) and module:
                self.tests[module].append(found[1])
                if module in self.end_to_end or line.rstrip().endswith(E2E_TEST_MARK):
                    self.e2e_pairs.add((module, found[1]))
            elif in_whole and (found := WHOLE_LINE.match(line)):
                self.whole.append(found[1])
            elif line.startswith(("- `", "  - `")):
                self.misplaced.append(f"line {number}: not a module under a package heading, a test "
                                      f"under a module, or a test of the whole: {line[:80]!r}")


@cache
def read_map() -> MapFile:
    return MapFile(MAP.read_text(encoding="utf-8"))


def test_the_map_reads_cleanly() -> None:
    assert not read_map().misplaced, "TESTS.md:\n" + "\n".join(read_map().misplaced)


def test_every_module_is_in_the_map() -> None:
    listed, modules = set(read_map().tests), set(project_modules())
    missing = sorted(modules - listed)
    stale = sorted(listed - modules)
    assert not missing, ("modules TESTS.md does not list (add each under its package with the "
                         "tests that cover it):\n" + "\n".join(missing))
    assert not stale, "TESTS.md lists modules that do not exist (renamed or removed?):\n" + "\n".join(stale)


def test_every_listed_test_file_exists() -> None:
    the_map = read_map()
    listed = {test for tests in the_map.tests.values() for test in tests} | set(the_map.whole)
    gone = sorted(test for test in listed if not (ROOT / test).is_file())
    assert not gone, "TESTS.md names test files that do not exist:\n" + "\n".join(gone)


def test_every_module_has_a_test() -> None:
    the_map = read_map()
    bare = sorted(module for module, tests in the_map.tests.items() if not tests)
    assert not bare, "modules TESTS.md lists with no test under them:\n" + "\n".join(bare)
    # A module with only end-to-end tests says so on its own line, where a reader sees it.
    unmarked = sorted(module for module, tests in the_map.tests.items() if module not in the_map.end_to_end
                      and tests and all((module, test) in the_map.e2e_pairs for test in tests))
    assert not unmarked, f"modules whose tests are all end to end, not marked {E2E_MARK!r}:\n" + "\n".join(unmarked)


def test_every_listed_test_covers_its_module() -> None:
    the_map, wrong = read_map(), []
    for module, tests in sorted(the_map.tests.items()):
        for test in tests:
            path = ROOT / test
            if not path.is_file():
                continue  # test_every_listed_test_file_exists says so
            if (module, test) in the_map.e2e_pairs and not reaches_end_to_end(module, path):
                wrong.append(f"{module}: {test} {E2E_TEST_MARK} neither imports nor runs anything that reaches it")
            elif (module, test) not in the_map.e2e_pairs and not covers(module, path):
                wrong.append(f"{module}: {test} is not named after it, does not import it, does not run it "
                             f"(if it reaches it only through others, end its line with {E2E_TEST_MARK!r})")
    assert not wrong, "TESTS.md pairs a module with a test that does not cover it:\n" + "\n".join(wrong)


def test_a_module_covered_directly_is_not_marked_end_to_end_only() -> None:
    the_map, tests = read_map(), suite_files()
    now_direct = sorted(
        f"{module}: {', '.join(str(t.relative_to(ROOT)) for t in tests if covers(module, t))}"
        for module in the_map.end_to_end if any(covers(module, t) for t in tests))
    assert not now_direct, (f"modules marked {E2E_MARK!r} that a test covers directly (list the test, "
                            "drop the mark):\n" + "\n".join(now_direct))


def test_every_test_file_is_in_the_map() -> None:
    the_map = read_map()
    listed = {test for tests in the_map.tests.values() for test in tests} | set(the_map.whole)
    unmapped = sorted(str(path.relative_to(ROOT)) for path in suite_files()
                      if str(path.relative_to(ROOT)) not in listed)
    assert not unmapped, ("test files TESTS.md does not place (list each under the module it covers, "
                          "or with the tests of the whole):\n" + "\n".join(unmapped))


def test_no_test_module_imports_another() -> None:
    sources = [*suite_files(), *(path for suite in SUITES for path in (ROOT / suite).glob("conftest.py")),
               *sorted((ROOT / "tests" / "support").rglob("*.py"))]
    sources.remove(Path(__file__).resolve())  # its own rule's examples are data
    found = sorted(f"{path.relative_to(ROOT)}: {', '.join(sorted(names))}" for path in sources
                   if (names := imported_test_modules(ast.parse(path.read_text(encoding="utf-8")))))
    assert not found, ("test modules imported by others (move what they share to a module of "
                       "tests/support, its fixtures to one conftest.py registers):\n" + "\n".join(found))


def test_the_rules_see_what_they_claim() -> None:
    # The detector itself, on files whose coverage is known: a test named after its module,
    # one that imports a module only in a script it runs as another user, a test that runs
    # ccw-mcp through tests.support.mcp_process, and the helper reached from the front end.
    assert covers("sandbox.access", ROOT / "tests/test_access.py")
    assert not covers("sandbox.__main__", ROOT / "tests/test_sandbox_gitdirs.py")  # a name is no evidence
    assert covers("sandbox.mountinfo", ROOT / "vm-tests/test_mountinfo.py")  # an indented f-string script's import
    assert "mcp_server.cli" in direct_reach(ROOT / "tests/test_ui.py")  # via cli_process's -c script
    assert "mcp_server.__main__" in direct_reach(ROOT / "tests/test_server_stdio.py")  # ccw-mcp
    assert not covers("sandbox.netlink", ROOT / "tests/test_policy.py")
    assert reaches_end_to_end("sandbox.namespaces", ROOT / "tests/test_server_stdio.py")  # ccw-mcp starts -m sandbox
    # A test module imported, bare, qualified, from the package, or in a script; a test's name
    # imported from a module that is not a test module is not one.
    source = ("from test_a import x\nimport tests.test_b as b\nfrom tests import test_c\n"
              "from tests.support.users import user_dir\nfrom mcp_server.x import test_y\n"
              "SCRIPT = 'import sys\\nfrom tests.test_d import e'\n")
    assert imported_test_modules(ast.parse(source)) == {"test_a", "tests.test_b", "tests.test_c", "tests.test_d"}
