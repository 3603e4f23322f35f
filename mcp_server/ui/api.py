"""What the dashboard shows, read from the state dir's database: capsules, runs, events.

Reads only, with no helper and no turn (like ``ccw capsule log``), so the page answers
while an agent's command runs.  Actions (diff, promote, destroy) are not here: the
server calls the tools themselves (``mcp_server.cli.capsule.call_tool``), so the same
policies judge a click as an agent's call.

Everything returned came, at least in part, from inside a capsule (argv, paths, hosts,
output): the page renders it as text, never as markup.
"""

from __future__ import annotations

from typing import Any

from mcp_server.cli.runlog import run_detail, run_summary
from mcp_server.events import EventLog
from mcp_server.journal import Journal
from mcp_server.state import State
from sandbox.errors import CcwError

EVENTS_LIMIT = 500


def capsules(state: State, log: EventLog) -> dict[str, Any]:
    """Every capsule the journal knows (live ones first, newest first), with its run count,
    and the newest event's id: where the page's live stream starts."""
    rows = state.execute(
        "SELECT c.capsule_id, c.workspace, c.created_at, c.destroyed_at, c.network, c.generation, "
        "(SELECT COUNT(*) FROM execs e WHERE e.capsule_id = c.capsule_id) AS runs FROM capsules c "
        "ORDER BY c.destroyed_at IS NOT NULL, c.created_at DESC")
    found = [{"capsule_id": row["capsule_id"], "workspace": row["workspace"], "created_at": row["created_at"],
              "destroyed_at": row["destroyed_at"], "egress": row["network"] not in (None, "", "none"),
              "generation": row["generation"], "runs": row["runs"]} for row in rows]
    return {"capsules": found, "last_event_id": log.last_id()}


def _journal(state: State, capsule_id: str) -> Journal:
    journal = Journal(state)
    if journal.capsule(capsule_id) is None:
        raise CcwError("NOT_FOUND", f"no capsule {capsule_id} in this state dir", {"capsule_id": capsule_id})
    return journal


def runs(state: State, capsule_id: str) -> dict[str, Any]:
    """A capsule's runs as ``ccw capsule log`` lists them, with each one's usage (for the plots)."""
    out = []
    for entry in _journal(state, capsule_id).execs(capsule_id):
        usage = entry.get("usage") or {}
        out.append({**run_summary(entry), "cpu_ms": usage.get("cpu_ms"), "rss_max_kb": usage.get("rss_max_kb")})
    return {"capsule_id": capsule_id, "runs": out}


def run(state: State, capsule_id: str, seq: int) -> dict[str, Any]:
    """One run whole, as ``ccw capsule show --json`` prints it: output, written, read, network."""
    journal = _journal(state, capsule_id)
    entry = next((e for e in journal.execs(capsule_id) if e["seq"] == seq), None)
    if entry is None:
        raise CcwError("NOT_FOUND", f"capsule {capsule_id} has no run {seq}", {"capsule_id": capsule_id, "run": seq})
    outputs = journal.outputs(capsule_id)
    return run_detail(entry, {stream: outputs.get((seq, stream)) for stream in ("stdout", "stderr")})


def events(log: EventLog, after: int, capsule_id: str | None) -> dict[str, Any]:
    """Events after ``after`` (of one capsule, if given), oldest first, at most EVENTS_LIMIT."""
    found = log.since(after, capsule_id, EVENTS_LIMIT)
    return {"events": [event.to_json() for event in found], "more": len(found) == EVENTS_LIMIT}
