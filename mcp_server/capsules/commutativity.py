"""Interactions between changed files: which can be promoted separately (capsule_commutativity, seed 003 §9).

The interaction graph has a node per changed path and an edge per piece of evidence,
each stated per pair:
- static imports between Python files (``ast``), resolved to changed files;
- the journal: one process that touched both files (when the tracer recorded
  per-process sets);
- with ``verify``: measured, the target command's outcome for {A}, {B} and {A, B}
  (each in a fresh capsule over the base) differs from what A and B alone predict.
  Each trial starts the services that ran beside the capsule's newest run of the target
  command first, ready before it, as deltamin's trials do (service_beside.py): a test
  that talked to a running app is judged with the app there, not refused a connection
  in every trial (which would make every outcome FAIL and hide every interaction).  A
  trial of a pair whose services do not become ready is UNRESOLVED, which matches no
  prediction: the pair is linked, so a doubt keeps its files together.

A changed file that several otherwise separate groups depend on (imports or reads) is a
*hub*: it conflicts with each group and belongs to none of them, as ``src/shared.py``
does in seed 003's example.  ``independent_sets`` are the connected components of the
graph without the hubs (each sorted, the list sorted); ``conflict_pairs`` are the
evidence pairs that involve a hub.  Same capsule, same bytes.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import trio

from mcp_server.capsules.executors import LocalExecutor
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.service_beside import services_beside
from mcp_server.capsules.trials import Material, Trials, predicate, units_from
from mcp_server.core.deltamin import FAIL, PASS
from mcp_server.fs import changeset
from mcp_server.fs.view import RootView
from mcp_server.journal_records import CapsuleRecord
from sandbox.errors import CcwError


def _module_paths(path: str, module: str, level: int) -> list[str]:
    """Candidate repo paths for an import of ``module`` from file ``path``."""
    if level:
        base = path.split("/")[:-level] if level <= path.count("/") + 1 else []
        parts = base + (module.split(".") if module else [])
    else:
        parts = module.split(".")
    stem = "/".join(parts)
    return [f"{stem}.py", f"{stem}/__init__.py"] if stem else []


def import_edges(sources: dict[str, bytes]) -> list[tuple[str, str]]:
    """(importer, imported) pairs among the given Python files, from their ``import``s."""
    edges = []
    known = set(sources)
    for path, data in sorted(sources.items()):
        try:
            tree = ast.parse(data)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets += _module_paths(path, alias.name, 0)
            elif isinstance(node, ast.ImportFrom):
                targets += _module_paths(path, node.module or "", node.level)
                for alias in node.names:  # from pkg import module
                    targets += _module_paths(path, f"{node.module}.{alias.name}" if node.module else alias.name,
                                             node.level)
            for target in targets:
                # A suffix match: "from src.mod import f" run from the repo root or its src/.
                for candidate in known:
                    if candidate != path and (candidate == target or candidate.endswith("/" + target)):
                        edges.append((path, candidate))
    return sorted(set(edges))


def analyse(nodes: list[str], edges: dict[tuple[str, str], list[dict[str, Any]]],
            dependents: dict[str, set[str]]) -> dict[str, Any]:
    """Independent sets and conflict pairs from an interaction graph (see the docstring of the tool)."""
    adjacency: dict[str, set[str]] = {n: set() for n in nodes}
    for a, b in edges:
        adjacency[a].add(b)
        adjacency[b].add(a)

    def components(without: set[str]) -> list[list[str]]:
        seen: set[str] = set()
        out = []
        for start in nodes:
            if start in seen or start in without:
                continue
            stack, group = [start], []
            seen.add(start)
            while stack:
                node = stack.pop()
                group.append(node)
                for nxt in adjacency[node]:
                    if nxt not in seen and nxt not in without:
                        seen.add(nxt)
                        stack.append(nxt)
            out.append(sorted(group))
        return sorted(out)

    hubs = set()
    for node in nodes:
        users = dependents.get(node, set())
        if len(users) < 2:
            continue
        groups = components({node})
        owning = {next(i for i, g in enumerate(groups) if u in g) for u in users}
        if len(owning) >= 2:
            hubs.add(node)
    conflict_pairs = sorted({tuple(sorted(pair)) for pair in edges if pair[0] in hubs or pair[1] in hubs})
    return {
        "independent_sets": components(hubs),
        "conflict_pairs": [list(p) for p in conflict_pairs],
        "evidence": [
            {"pair": list(pair), "kinds": sorted({e["kind"] for e in items}), "details": items}
            for pair, items in sorted(edges.items())
        ],
    }


@dataclass(frozen=True)
class Question:
    """What capsule_commutativity is asked."""

    capsule_id: str
    target_cmd: list[str] | None = None
    verify: bool = False  # measure interactions with target_cmd
    failure_predicate: Any = "exit_code"


@dataclass
class _Graph:
    """The interaction graph: changed paths, evidence per pair, and who depends on whom."""

    nodes: list[str]
    edges: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    dependents: dict[str, set[str]] = field(default_factory=dict)

    def link(self, a: str, b: str, item: dict[str, Any], user: str | None = None, used: str | None = None) -> None:
        """Add evidence that ``a`` and ``b`` interact (``user`` depends on ``used``, if one does)."""
        key = (a, b) if a < b else (b, a)
        self.edges.setdefault(key, []).append(item)
        if user is not None and used is not None:
            self.dependents.setdefault(used, set()).add(user)


async def commutativity(service: CapsuleService, question: Question) -> dict[str, Any]:
    """Which changed files can be promoted separately, with the evidence for each link."""
    record = service.live_record(question.capsule_id)
    changes = await service.changes(record.capsule_id)
    root_fd = await service.open_root(record.capsule_id)

    def read() -> tuple[Material, dict[str, bytes]]:
        with RootView.from_fd(root_fd) as capsule, RootView.open(record.base) as base:
            entries = changeset.expand(changes, base, capsule)
            material = units_from(entries, base, capsule)
            sources = {}
            for entry in entries:
                if entry.path.endswith(".py"):
                    side = entry.new if entry.new is not None else entry.old
                    view = capsule if entry.new is not None else base
                    if side is not None and side.kind == "file":
                        sources[entry.path] = view.read_bytes(entry.path)
            return material, sources

    material, sources = await trio.to_thread.run_sync(read)
    graph = _Graph(sorted({u.path for u in material.units}, key=lambda p: p.encode("utf-8", "surrogateescape")))
    nodes = graph.nodes
    for importer, imported in import_edges(sources):
        if importer in nodes and imported in nodes:
            graph.link(importer, imported, {"kind": "import", "detail": f"{importer} imports {imported}"},
                       importer, imported)
    for ex in service.journal.execs(record.capsule_id):
        for proc in ex["touched"].get("processes") or []:
            touched = sorted(set(proc.get("read", [])) | set(proc.get("written", [])))
            for a, b in combinations([p for p in touched if p in nodes], 2):
                graph.link(a, b, {"kind": "journal", "detail": f"exec {ex['seq']} pid {proc.get('pid')} touched both"})
    if question.verify:
        await _measure(graph, question, service, record, material)
    return analyse(nodes, graph.edges, graph.dependents)


async def _measure(graph: _Graph, question: Question, service: CapsuleService, record: CapsuleRecord,
                   material: Material) -> None:
    """Link the pairs whose joint outcome differs from what each alone predicts (n + n(n-1)/2 trials)."""
    nodes = graph.nodes
    if not question.target_cmd:
        raise CcwError("INVALID_ARGUMENT", "verify needs target_cmd: the command whose outcome is compared")
    if len(nodes) > 12:
        raise CcwError("TOO_LARGE", f"verify runs n + n(n-1)/2 trials; {len(nodes)} changed files is too many "
                       "(at most 12): fork the capsule and remove unrelated changes first")
    judge = predicate(question.failure_predicate)
    argv = list(question.target_cmd)
    services = services_beside(service, record, argv)
    executor = LocalExecutor()
    executor.check_trials(service, record, services)
    trials = Trials(service, record, material, argv, judge, 600_000, executor, services)
    index = {p: [i for i, u in enumerate(material.units) if u.path == p] for p in nodes}
    singles = dict(zip(nodes, await trials.batch([tuple(index[p]) for p in nodes]), strict=True))
    pairs = list(combinations(nodes, 2))
    together = await trials.batch([tuple(index[a] + index[b]) for a, b in pairs])
    for (a, b), outcome in zip(pairs, together, strict=True):
        predicted = FAIL if FAIL in (singles[a], singles[b]) else PASS
        if outcome != predicted:
            graph.link(a, b, {"kind": "measured", "detail": f"alone: {singles[a]}, {singles[b]}; together: {outcome}"})
