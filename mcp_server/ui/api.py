"""What the dashboard shows, read from the state dir's database: capsules, runs, events,
and the connections waiting for a person's answer.

Reads only, with no helper and no turn (like ``ccw capsule log``), so the page answers
while an agent's command runs.  Actions (diff, promote, destroy) are not here: the
server calls the tools themselves (``mcp_server.cli.capsule.call_tool``), so the same
policies judge a click as an agent's call.  The one write is a question's answer
(``answer_question``), as ``ccw net approve``/``deny`` write it: the page holds the
person's token, and no MCP tool answers a question.

Everything returned came, at least in part, from inside a capsule (argv, paths, hosts,
output): the page renders it as text, never as markup.
"""

from __future__ import annotations

import os
from typing import Any

from mcp_server.capsules import asks
from mcp_server.events import KINDS, EventLog
from mcp_server.journal import Journal
from mcp_server.journal_view import exec_detail, exec_summary
from mcp_server.state import State
from sandbox.errors import CcwError

EVENTS_LIMIT = 500  # the live stream's batch (``after``)
# Pages: (default, most) items per request.  A state dir may hold hundreds of capsules and
# a capsule thousands of runs and events; the page asks for one page, then older ones.
PAGES = {"capsules": (50, 200), "runs": (100, 500), "events": (200, 1000), "races": (20, 100)}
# A run's file lists beyond this are counted, not sent (``ccw capsule show --all`` lists them).
DETAIL_PATHS = 2000


def page_limit(what: str, asked: int | None) -> int:
    """The page size for ``asked`` (None: the default), at most the cap of ``what``."""
    default, most = PAGES[what]
    if asked is None:
        return default
    if asked < 1:
        raise CcwError("INVALID_ARGUMENT", f"limit must be at least 1 (at most {most} are sent)", {"limit": asked})
    return min(asked, most)


def capsules(state: State, log: EventLog, limit: int | None = None, after: str | None = None) -> dict[str, Any]:
    """A page of the capsules the journal knows (live ones first, newest first), with their run
    counts: the first ``limit``, or those listed after capsule ``after``; ``more`` when others
    follow; and the newest event's id, where the page's live stream starts."""
    size = page_limit("capsules", limit)
    # The order as a key (live first, then newest first), so that a page continues after a row.
    order = "c.destroyed_at IS NOT NULL, c.created_at DESC, c.capsule_id DESC"
    where, params = "", tuple[Any, ...]()
    if after is not None:
        found = state.execute("SELECT destroyed_at IS NOT NULL AS gone, created_at FROM capsules WHERE capsule_id = ?",
                              (after,))
        if not found:
            raise CcwError("NOT_FOUND", f"no capsule {after} in this state dir", {"capsule_id": after})
        gone, created = found[0]["gone"], found[0]["created_at"]
        where = ("WHERE (c.destroyed_at IS NOT NULL) > ? OR ((c.destroyed_at IS NOT NULL) = ? AND "
                 "(c.created_at < ? OR (c.created_at = ? AND c.capsule_id < ?)))")
        params = (gone, gone, created, created, after)
    rows = state.execute(
        "SELECT c.capsule_id, c.workspace, c.created_at, c.destroyed_at, c.network, c.generation, "
        "(SELECT COUNT(*) FROM execs e WHERE e.capsule_id = c.capsule_id) AS runs FROM capsules c "
        f"{where} ORDER BY {order} LIMIT ?", (*params, size + 1))
    shown = [{"capsule_id": row["capsule_id"], "workspace": row["workspace"], "created_at": row["created_at"],
              "destroyed_at": row["destroyed_at"], "egress": row["network"] not in (None, "", "none"),
              "generation": row["generation"], "runs": row["runs"]} for row in rows[:size]]
    _add_services(state, shown)
    (total,) = state.execute("SELECT COUNT(*) AS n FROM capsules")
    return {"capsules": shown, "more": len(rows) > size, "total": total["n"], "last_event_id": log.last_id()}


def _add_services(state: State, shown: list[dict[str, Any]]) -> None:
    """Each shown capsule's kept services (names) and forwarded ports (capsules/services.py,
    ports.py; their tables exist once a service was started or a port forwarded)."""
    ids = [one["capsule_id"] for one in shown]
    marks = ", ".join("?" for _ in ids)
    tables = {row["name"] for row in state.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for one in shown:
        one["services"], one["ports"] = [], []
    by_id = {one["capsule_id"]: one for one in shown}
    if "services" in tables and ids:
        for row in state.execute(f"SELECT capsule_id, name FROM services WHERE capsule_id IN ({marks}) "
                                 "ORDER BY name", tuple(ids)):
            by_id[row["capsule_id"]]["services"].append(row["name"])
    if "ports" in tables and ids:
        for row in state.execute(f"SELECT capsule_id, port, host_port FROM ports WHERE capsule_id IN ({marks}) "
                                 "ORDER BY port", tuple(ids)):
            by_id[row["capsule_id"]]["ports"].append({"port": row["port"], "host_port": row["host_port"]})


def _journal(state: State, capsule_id: str) -> Journal:
    journal = Journal(state)
    if journal.capsule(capsule_id) is None:
        raise CcwError("NOT_FOUND", f"no capsule {capsule_id} in this state dir", {"capsule_id": capsule_id})
    return journal


def runs(state: State, capsule_id: str, limit: int | None = None, before: int | None = None) -> dict[str, Any]:
    """A page of a capsule's runs as ``ccw capsule log`` lists them, with each one's usage (for
    the plots): the newest ``limit`` (numbered below ``before``, if given), oldest first;
    ``more`` when older ones exist."""
    size = page_limit("runs", limit)
    entries = _journal(state, capsule_id).execs(capsule_id, before=before, limit=size + 1)
    out = []
    for entry in entries[-size:]:
        usage = entry.get("usage") or {}
        out.append({**exec_summary(entry), "cpu_ms": usage.get("cpu_ms"), "rss_max_kb": usage.get("rss_max_kb"),
                    "rss_max_process_kb": usage.get("rss_max_process_kb")})
    (total,) = state.execute("SELECT COUNT(*) AS n FROM execs WHERE capsule_id = ?", (capsule_id,))
    return {"capsule_id": capsule_id, "runs": out, "more": len(entries) > size, "total": total["n"]}


def run(state: State, capsule_id: str, seq: int) -> dict[str, Any]:
    """One run whole, as ``ccw capsule show --json`` prints it (output, written, read, network),
    its file lists cut at ``DETAIL_PATHS`` (``written_total``, ``read_total`` count them all)."""
    journal = _journal(state, capsule_id)
    found = journal.execs(capsule_id, before=seq + 1, limit=1)
    if not found or found[0]["seq"] != seq:
        raise CcwError("NOT_FOUND", f"capsule {capsule_id} has no run {seq}", {"capsule_id": capsule_id, "run": seq})
    outputs = journal.outputs(capsule_id, seq)
    detail = exec_detail(found[0], {stream: outputs.get((seq, stream)) for stream in ("stdout", "stderr")})
    for key in ("written", "read"):
        paths = detail[key]
        detail[f"{key}_total"] = None if paths is None else len(paths)
        detail[key] = None if paths is None else paths[:DETAIL_PATHS]
    return detail


def kinds_of(text: str | None) -> tuple[str, ...]:
    """The event kinds a comma-separated ``kinds`` parameter names (empty: every kind)."""
    named = tuple(kind for kind in (text or "").split(",") if kind)
    unknown = sorted(set(named) - set(KINDS))
    if unknown:
        raise CcwError("INVALID_ARGUMENT", f"unknown event kinds {unknown}; known: {', '.join(KINDS)}",
                       {"kinds": unknown})
    return named


def events(log: EventLog, after: int, capsule_id: str | None) -> dict[str, Any]:
    """Events after ``after`` (of one capsule, if given), oldest first, at most EVENTS_LIMIT."""
    found = log.since(after, capsule_id, EVENTS_LIMIT)
    return {"events": [event.to_json() for event in found], "more": len(found) == EVENTS_LIMIT}


def older_events(log: EventLog, capsule_id: str | None, kinds: tuple[str, ...], limit: int | None = None,
                 before: int | None = None) -> dict[str, Any]:
    """A page of events going back: the newest ``limit`` (of one capsule, of ``kinds``, with an
    id below ``before``: each if given), oldest first; ``more`` when older ones exist."""
    size = page_limit("events", limit)
    found = log.latest(capsule_id, size + 1, before=before, kinds=kinds)
    return {"events": [event.to_json() for event in found[-size:]], "more": len(found) > size}


def questions(state: State) -> dict[str, Any]:
    """The questions waiting for an answer, oldest first (capsules/asks.py)."""
    return {"questions": [question.to_json() for question in asks.pending(state)]}


def question(state: State, question_id: int) -> dict[str, Any]:
    """One question as it stands now (an approved proposal's once its rules went in)."""
    found = asks.get(state, question_id)
    if found is None:
        raise CcwError("NOT_FOUND", f"no question {question_id} about the network", {"id": question_id})
    return found.to_json()


def answer_question(state: State, question_id: int, body: dict[str, Any]) -> dict[str, Any]:
    """Answer a question from the page: ``answer`` (once, capsule, denied) and a ``reason``
    for a denial; the answer's ``who`` says it came from the dashboard."""
    verdict, reason = body.get("answer"), body.get("reason")
    if not isinstance(verdict, str) or (reason is not None and not isinstance(reason, str)):
        raise CcwError("INVALID_ARGUMENT", "answer: once, capsule or denied; reason: text")
    if verdict == "denied" and not (reason or "").strip():
        raise CcwError("INVALID_ARGUMENT", "a denial needs a reason: the agent is told it")
    return asks.answer(state, question_id, verdict, f"uid {os.getuid()} (ccw ui)", reason).to_json()
