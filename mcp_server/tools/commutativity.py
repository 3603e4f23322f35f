"""capsule_commutativity: which changed files can be promoted separately (seed 003 §9).

The interaction graph has a node per changed path and an edge per piece of evidence,
each stated per pair:
- static imports between Python files (``ast``), resolved to changed files;
- the journal: one process that touched both files (when the tracer recorded
  per-process sets);
- with ``verify``: measured, the target command's outcome for {A}, {B} and {A, B}
  (each in a fresh capsule over the base) differs from what A and B alone predict.

A changed file that several otherwise separate groups depend on (imports or reads) is a
*hub*: it conflicts with each group and belongs to none of them, as ``src/shared.py``
does in seed 003's example.  ``independent_sets`` are the connected components of the
graph without the hubs (each sorted, the list sorted); ``conflict_pairs`` are the
evidence pairs that involve a hub.  Same capsule, same bytes.
"""

from __future__ import annotations

import ast
from itertools import combinations
from typing import Any

import trio

from mcp_server.core.deltamin import FAIL, PASS
from mcp_server.fs import changeset
from mcp_server.fs.view import RootView
from mcp_server.journal import Journal
from mcp_server.tools.capsule import CAPSULE_ID, live_record
from mcp_server.tools.deltamin import Material, Trials, predicate, units_from
from mcp_server.tools.registry import ToolContext, ToolSpec
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
                    targets += _module_paths(path, f"{node.module}.{alias.name}" if node.module else alias.name, node.level)
            for target in targets:
                # A suffix match: "from src.mod import f" run from the repo root or its src/.
                for candidate in known:
                    if candidate != path and (candidate == target or candidate.endswith("/" + target)):
                        edges.append((path, candidate))
    return sorted(set(edges))


def analyse(nodes: list[str], edges: dict[tuple[str, str], list[dict[str, Any]]], dependents: dict[str, set[str]]) -> dict[str, Any]:
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


async def capsule_commutativity(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Which changed files can be promoted separately, with the evidence for each link."""
    record = live_record(ctx, args["capsule_id"])
    helper = await ctx.helper()
    changes = (await helper.request("changes", {"capsule_id": record.capsule_id}))["changes"]
    root_fd = await helper.open_root(record.capsule_id)

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
    nodes = sorted({u.path for u in material.units}, key=lambda p: p.encode("utf-8", "surrogateescape"))
    edges: dict[tuple[str, str], list[dict[str, Any]]] = {}
    dependents: dict[str, set[str]] = {}

    def link(a: str, b: str, item: dict[str, Any], user: str | None = None, used: str | None = None) -> None:
        key = (a, b) if a < b else (b, a)
        edges.setdefault(key, []).append(item)
        if user is not None and used is not None:
            dependents.setdefault(used, set()).add(user)

    for importer, imported in import_edges(sources):
        if importer in nodes and imported in nodes:
            link(importer, imported, {"kind": "import", "detail": f"{importer} imports {imported}"}, importer, imported)
    for ex in Journal(ctx.state).execs(record.capsule_id):
        for proc in ex["touched"].get("processes") or []:
            touched = sorted(set(proc.get("read", [])) | set(proc.get("written", [])))
            for a, b in combinations([p for p in touched if p in nodes], 2):
                link(a, b, {"kind": "journal", "detail": f"exec {ex['seq']} pid {proc.get('pid')} touched both"})
    if args.get("verify"):
        if not args.get("target_cmd"):
            raise CcwError("INVALID_ARGUMENT", "verify needs target_cmd: the command whose outcome is compared")
        if len(nodes) > 12:
            raise CcwError("TOO_LARGE", f"verify runs n + n(n-1)/2 trials; {len(nodes)} changed files is too many "
                           "(at most 12): fork the capsule and remove unrelated changes first")
        judge = predicate(args.get("failure_predicate", "exit_code"))
        trials = Trials(ctx, record, material, list(args["target_cmd"]), judge, 600_000)
        index = {p: [i for i, u in enumerate(material.units) if u.path == p] for p in nodes}
        singles = dict(zip(nodes, await trials.batch([tuple(index[p]) for p in nodes]), strict=True))
        pairs = list(combinations(nodes, 2))
        together = await trials.batch([tuple(index[a] + index[b]) for a, b in pairs])
        for (a, b), outcome in zip(pairs, together, strict=True):
            predicted = FAIL if FAIL in (singles[a], singles[b]) else PASS
            if outcome != predicted:
                link(a, b, {"kind": "measured", "detail": f"alone: {singles[a]}, {singles[b]}; together: {outcome}"})
    return analyse(nodes, edges, dependents)


TOOLS = [
    ToolSpec(
        name="capsule_commutativity",
        family="capsule",
        title="Change commutativity",
        description=(
            "Which changed files can be promoted separately. Links come from imports between Python "
            "files, processes that touched both files, and (verify) measured interactions of target_cmd. "
            "A file several independent groups depend on is a conflict with each of them."
        ),
        input_schema={
            "type": "object", "required": ["capsule_id"], "additionalProperties": False,
            "properties": {
                "capsule_id": CAPSULE_ID,
                "target_cmd": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "verify": {"type": "boolean"},
                "failure_predicate": {"enum": ["exit_code", "timeout"]},
            },
        },
        output_schema={
            "type": "object", "required": ["independent_sets", "conflict_pairs", "evidence"], "additionalProperties": False,
            "properties": {
                "independent_sets": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
                "conflict_pairs": {"type": "array", "items": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}},
                "evidence": {"type": "array", "items": {"type": "object"}},
            },
        },
        handler=capsule_commutativity,
        scope="exec",
        aliases=("capsule/commutativity",),
        read_only=True,
        idempotent=True,
    ),
]
