"""Declared dependencies match the import graph, and the build system can read pyproject.toml.

The import graph is every ``import`` statement (module level or not) in the runtime
packages (``sandbox/``, ``mcp_server/``) and in what only tests run (``tests/``,
``vm-tests/``, ``bench/``).  Each top-level module that is neither the standard library
nor ours is mapped to the distribution that provides it in this environment
(``importlib.metadata.packages_distributions``).  The runtime dependencies must be
exactly what the runtime packages import; the ``test`` extra must be what the tests
import beyond those, plus the tools that run without being imported.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
RUNTIME_DIRS = ("sandbox", "mcp_server")
TEST_DIRS = ("tests", "vm-tests", "bench")
# Declared in the test extra, used by `./dev test` (and tests/test_layers.py), never imported.
TEST_TOOLS = {"pytest-timeout", "ruff", "mypy", "import-linter"}


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(dirs: tuple[str, ...]) -> dict[str, set[str]]:
    """Top-level names of absolute imports in every .py file under ``dirs``, with the files."""
    found: dict[str, set[str]] = {}
    for directory in dirs:
        for file in sorted((ROOT / directory).rglob("*.py")):
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(str(file.relative_to(ROOT)))
    return found


def first_party(dirs: tuple[str, ...]) -> set[str]:
    """Our own top-level names: the packages, and modules the test dirs import as siblings."""
    names = {*RUNTIME_DIRS, *TEST_DIRS, "conftest"}
    for directory in dirs:
        for path in (ROOT / directory).rglob("*"):
            if path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists()):
                names.add(path.stem)
    return names


def third_party(dirs: tuple[str, ...]) -> dict[str, set[str]]:
    """Distribution (canonical name) → the files that import it, for imports under ``dirs``."""
    providers = importlib.metadata.packages_distributions()
    ours = first_party(dirs)
    out: dict[str, set[str]] = {}
    for module, files in imported_modules(dirs).items():
        if module in sys.stdlib_module_names or module in ours:
            continue
        distributions = providers.get(module)
        assert distributions, f"no installed distribution provides {module!r} (imported by {sorted(files)})"
        for distribution in distributions:
            out.setdefault(canonical(distribution), set()).update(files)
    return out


def declared(requirements: list[str]) -> set[str]:
    """Canonical names of a list of PEP 508 requirements."""
    return {canonical(Requirement(line).name) for line in requirements}


def test_runtime_dependencies_are_exactly_what_the_runtime_imports() -> None:
    imported = third_party(RUNTIME_DIRS)
    runtime = declared(PYPROJECT["project"]["dependencies"])
    missing = {name: sorted(files) for name, files in imported.items() if name not in runtime}
    assert not missing, f"imported but not declared in [project] dependencies: {missing}"
    assert runtime - set(imported) == set(), "declared but never imported by sandbox/ or mcp_server/"


def test_test_extra_is_what_only_tests_import_plus_the_tools() -> None:
    runtime = declared(PYPROJECT["project"]["dependencies"])
    test_extra = declared(PYPROJECT["project"]["optional-dependencies"]["test"])
    imported = third_party(TEST_DIRS)
    missing = {name: sorted(files) for name, files in imported.items() if name not in runtime | test_extra}
    assert not missing, f"imported by tests/bench but not declared in the test extra: {missing}"
    assert test_extra - set(imported) == TEST_TOOLS, "the test extra holds something nothing uses"
    assert not runtime & test_extra, "a runtime dependency is repeated in the test extra"


def test_one_http_client() -> None:
    every = set(third_party(RUNTIME_DIRS)) | set(third_party(TEST_DIRS))
    assert every & {"httpx", "httpx2", "requests", "aiohttp", "urllib3"} == {"httpx2"}


def test_setuptools_minimum_reads_the_license_field() -> None:
    # setuptools reads `license = "<SPDX expression>"` (PEP 639) from 77 on; older
    # releases reject the string form, so the declared minimum must be at least that.
    minimum = None
    for line in PYPROJECT["build-system"]["requires"]:
        requirement = Requirement(line)
        if canonical(requirement.name) == "setuptools":
            bounds = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==", "~=")]
            minimum = max(bounds) if bounds else None
    assert isinstance(PYPROJECT["project"]["license"], str)
    assert minimum is not None and minimum >= Version("77"), minimum


def test_the_graph_maps_imports_to_distributions() -> None:
    # The check would catch a new import: a module no distribution of ours provides
    # shows up as third party, mapped to its distribution.
    assert "pydantic-core" in third_party(("mcp_server",))
    assert "psutil" in third_party(("vm-tests",)) and "psutil" not in third_party(RUNTIME_DIRS)
