"""The races a state dir has seen (capsule_race's tables), kept for ``ccw ui`` (issue 39).

A race is a run (capsules/run.py), and a run's result lives in the front end's memory
only: gone after an hour, or with the process.  A person comparing attempts wants the
table after that, in the dashboard, which is another process.  So capsules/race.py
records each race here, in the state dir's database (``races``), as it goes:

- ``begin`` when the race starts (its question, its run id, whose run it is);
- ``progress`` as each capsule's row ends (the rows so far, ranked, and the capsules
  still running), so the dashboard shows the table filling up;
- ``end`` with the whole table, or the error that ended it, or ``cancelled``.

Each write is also a ``race`` event in the same transaction (mcp_server/events.py), which
is how the dashboard, following the events, knows to read the race again.

- **Whose.**  The rows are the state dir's, which is its user's alone (0600 in 0700),
  like the capsules and runs beside them; the dashboard serves them to its token only.
  ``owner`` is the name of the bearer token whose call started the race (None over stdio
  and the unix socket), shown, not used to hide: the dashboard is the state dir user's.
- **A front end that died mid-race** leaves a row saying ``running``.  Each row names the
  process that runs it (its pid and start time, so a reused pid is not taken for it);
  a reader finds that process gone and says ``lost`` (``shown_state``).
- **Bounded.**  At most ``KEEP_RACES`` races (the oldest go as a new one begins); a row's
  verdict details are cut at ``MAX_DETAILS`` characters; a race has at most
  capsules/race.py's MAX_RACERS rows.  Everything in a row came in part from inside a
  capsule (the command, the policy's details): the dashboard shows it as text.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from typing import Any

from mcp_server import events
from mcp_server.state import State
from sandbox.errors import CcwError

KEEP_RACES = 200
MAX_DETAILS = 2000  # characters of a row's verdict details kept

_DDL = """
CREATE TABLE IF NOT EXISTS races (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    race_id TEXT NOT NULL UNIQUE,
    started_at TEXT NOT NULL,
    ended_at TEXT,
    owner TEXT,
    process TEXT NOT NULL,
    state TEXT NOT NULL,
    question TEXT NOT NULL,
    result TEXT,
    error TEXT
);
"""


def _ensure(state: State) -> None:
    state.ensure_schema("races", _DDL)
    events.ensure_schema(state)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19].decode() if len(fields) > 19 else None


def this_process() -> str:
    """This process as a race row names it: ``PID:START``."""
    return f"{os.getpid()}:{_started(os.getpid())}"


def _alive(process: str) -> bool:
    pid, _, started = process.partition(":")
    return pid.isdigit() and _started(int(pid)) == started


def _cut(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        details = row.get("verdict_details")
        if isinstance(details, str) and len(details) > MAX_DETAILS:
            row = {**row, "verdict_details": details[:MAX_DETAILS] + "…"}
        out.append(row)
    return out


def begin(state: State, race_id: str, owner: str | None, question: dict[str, Any]) -> None:
    """Record a race that starts now (``question``: capsule_ids, cmd, policy, timeout_ms)."""
    _ensure(state)
    with state.transaction() as db:
        db.execute("INSERT INTO races (race_id, started_at, owner, process, state, question, result) "
                   "VALUES (?, ?, ?, ?, 'running', ?, ?)",
                   (race_id, _now(), owner, this_process(), json.dumps(question), json.dumps({"rows": []})))
        db.execute("DELETE FROM races WHERE seq <= (SELECT MAX(seq) FROM races) - ?", (KEEP_RACES,))
        events.emit(db, "race", None, {"race_id": race_id, "state": "running", "ended": 0,
                                       "total": len(question["capsule_ids"])})


def progress(state: State, race_id: str, rows: Sequence[dict[str, Any]], total: int) -> None:
    """The rows ended so far (ranked), while the others still run."""
    _ensure(state)
    with state.transaction() as db:
        db.execute("UPDATE races SET result = ? WHERE race_id = ? AND state = 'running'",
                   (json.dumps({"rows": _cut(rows)}), race_id))
        events.emit(db, "race", None, {"race_id": race_id, "state": "running", "ended": len(rows), "total": total})


def end(state: State, race_id: str, result: dict[str, Any] | None, error: dict[str, str] | None = None) -> None:
    """The race ended: its table (``result``), or the ``error`` that ended it, or neither: cancelled."""
    _ensure(state)
    ended = "finished" if result is not None else "failed" if error is not None else "cancelled"
    with state.transaction() as db:
        if result is not None:
            db.execute("UPDATE races SET result = ? WHERE race_id = ?",
                       (json.dumps({**result, "rows": _cut(result["rows"])}), race_id))
        db.execute("UPDATE races SET state = ?, ended_at = ?, error = ? WHERE race_id = ?",
                   (ended, _now(), None if error is None else json.dumps(error), race_id))
        events.emit(db, "race", None, {"race_id": race_id, "state": ended})


def shown_state(row: Any) -> str:
    """A row's state as a reader should tell it: ``lost`` for a race whose process is gone."""
    return "lost" if row["state"] == "running" and not _alive(row["process"]) else str(row["state"])


def _summary(row: Any) -> dict[str, Any]:
    question, result = json.loads(row["question"]), json.loads(row["result"] or "{}")
    rows = result.get("rows") or []
    return {"seq": row["seq"], "race_id": row["race_id"], "started_at": row["started_at"],
            "ended_at": row["ended_at"], "owner": row["owner"], "state": shown_state(row),
            "cmd": question["cmd"], "policy": question.get("policy"), "capsules": len(question["capsule_ids"]),
            "ended": len(rows), "best": rows[0] if rows else None}


def recent(state: State, limit: int, before: int | None = None) -> tuple[list[dict[str, Any]], bool]:
    """The newest ``limit`` races (numbered below ``before``, if given), newest first, as
    summaries (their best row so far); and whether older ones exist."""
    _ensure(state)
    found = state.execute("SELECT * FROM races WHERE seq < ? ORDER BY seq DESC LIMIT ?",
                          (before if before is not None else 2**62, limit + 1))
    return [_summary(row) for row in found[:limit]], len(found) > limit


def get(state: State, race_id: str) -> dict[str, Any]:
    """One race whole: its summary, question, table (``rows``, ranked; while running, those
    ended so far) and the capsules still running (``pending``); NOT_FOUND if unknown."""
    _ensure(state)
    found = state.execute("SELECT * FROM races WHERE race_id = ?", (race_id,))
    if not found:
        raise CcwError("NOT_FOUND", f"no race {race_id} in this state dir (at most {KEEP_RACES} are kept; "
                       "list them with GET /api/races)", {"race_id": race_id})
    row = found[0]
    question, result = json.loads(row["question"]), json.loads(row["result"] or "{}")
    ended = {one["capsule_id"] for one in result.get("rows") or []}
    return {**_summary(row), "question": question, **result,
            "pending": [] if row["state"] != "running" else [c for c in question["capsule_ids"] if c not in ended],
            "error": None if row["error"] is None else json.loads(row["error"])}
