"""No import cycle in the front end or the helper, imports inside functions included (issue 27).

import-linter's ``layers`` contract (tests/test_layers.py) orders the packages, but it
cannot see a cycle between two modules of one layer, and an import moved into a function
body hides a cycle from Python itself (the module loads, because the import runs later)
without removing it: the two modules still need each other.  So this test reads every
module's AST, takes every ``import`` and ``from ... import`` wherever it stands (module
level, function bodies, ``if TYPE_CHECKING``), and fails on any strongly connected set of
modules, naming one cycle through it with the line of each import.

One kind of edge is left out: a package importing its own submodule (``capsules/
__init__.py`` naming ``capsules.turns``), since every submodule's import runs its
package first, so the reverse edge is always there and the pair is no design cycle.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mcp_server", "sandbox")

@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


def modules(package: str) -> dict[str, Module]:
    """Every module of ``package`` by dotted name (a package by its own name, not ``__init__``)."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        found[name] = Module(name, path, is_package)
    return found


def _known(name: str, known: dict[str, Module]) -> str | None:
    """The longest prefix of ``name`` that is one of ``known`` (``a.b.attr`` -> ``a.b``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: Module, known: dict[str, Module]) -> dict[str, int]:
    """The modules of ``known`` that ``module`` imports anywhere in its text, with the line of the first import."""
    here = module.name if module.is_package else module.name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join([*here.split(".")[: len(here.split(".")) - node.level + 1],
                                 *filter(None, [node.module])])
            else:
                base = node.module or ""
            # ``from a import b``: the submodule a.b if there is one, else a name defined in a.
            targets = [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            hit = _known(target, known)
            if hit is not None and hit != module.name:
                found.setdefault(hit, node.lineno)
    return found


def graph(package: str) -> dict[str, dict[str, int]]:
    """The import graph of ``package``: module -> {imported module: line}, a package's own submodules left out."""
    known = modules(package)
    edges = {}
    for module in known.values():
        edges[module.name] = {target: line for target, line in imports(module, known).items()
                              if not (module.is_package and target.startswith(module.name + "."))}
    return edges


def strongly_connected(edges: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The sets of two or more modules that reach each other (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(frozenset(members))
    return found


def one_cycle(edges: dict[str, dict[str, int]], members: frozenset[str]) -> str:
    """A shortest cycle through the first of ``members``, as ``a -> b (line n) -> ... -> a``."""
    start = min(members)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node]):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                path.reverse()
                hops = [f"{b} (line {edges[a][b]} of {a})" for a, b in zip(path, [*path[1:], start], strict=True)]
                return " -> ".join([start, *hops])
            if child in members and child not in came_from and child != start:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {start}")  # Tarjan's set always has one


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    edges = graph(package)
    cycles = list(strongly_connected(edges))
    assert not cycles, "import cycles (move what is shared to the lower module, not the import into a function):\n" \
        + "\n".join(one_cycle(edges, members) for members in cycles)


def test_a_cycle_behind_a_function_level_import_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The detector itself: a cycle whose one half imports inside a function, and a package
    importing its own submodule (no cycle)."""
    package = tmp_path / "demo"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("from demo import low\n")
    (package / "low.py").write_text("import os\n\ndef later():\n    from demo.high import thing\n    return thing\n")
    (package / "high.py").write_text("from demo.low import later\nthing = later\n")
    (package / "inner" / "__init__.py").write_text("from . import leaf\n")
    (package / "inner" / "leaf.py").write_text("from demo.inner import __doc__ as doc\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    edges = graph("demo")
    assert edges["demo.low"] == {"demo.high": 4} and edges["demo.high"] == {"demo.low": 1}
    assert edges["demo.inner"] == {} and edges["demo.inner.leaf"] == {"demo.inner": 1}
    cycles = strongly_connected(edges)
    assert cycles == [frozenset({"demo.high", "demo.low"})]
    assert one_cycle(edges, cycles[0]) == ("demo.high -> demo.low (line 1 of demo.high) "
                                           "-> demo.high (line 4 of demo.low)")
