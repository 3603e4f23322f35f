"""The events of a state dir: a typed stream of what its capsules do, kept in its database.

The journal records enough to replay and judge execs; a person deciding whether to
promote wants to *watch* them: what ran, what it wrote and read, where it tried to
connect and what was decided.  Each such fact is an event, appended to the ``events``
table of the state dir's SQLite database in the same transaction as the journal row it
describes (so a watcher never sees an event whose exec is not in the journal, nor the
other way round), and numbered by SQLite in commit order.

Why the database and not a socket.  Every process of a state dir (the MCP server an
agent started, each ``ccw`` command, the dashboard) opens the same database; whoever
writes, every reader sees the same numbered stream, and a reader that starts late or
reconnects asks for what came after the last id it saw (``since``).  Readers in other
processes learn of new rows by polling: ``follow`` stats the database's files every
``POLL_S`` and queries only when a commit changed them.  A person's eye needs no less
delay, and a writer pays nothing for its watchers.

Kinds (``KINDS``) and what their ``data`` holds; paths are relative to the workspace and
every text in them came from inside a capsule, so it is untrusted:

- ``capsule.created``  workspace, base, parent, network ("none" or the allowlist's rules),
  exposed dirs;  ``capsule.destroyed``  (nothing).
- ``run.queued``  ticket, label (a call asked for the capsule's turn and waits behind
  another);  ``run.started``  ticket, label, waited_ms;  ``run.failed``  ticket, label,
  error ("CODE: message", cut): a call that started and ended in an error, so no run
  (an exec the helper refused).  Turn events, of any call that takes a turn (an exec, a
  fork, a destroy); stored kinds, so named "run" still (docs/names.md).
- ``run.finished``  an exec's end: seq, argv, cwd, exit_code, signal, timed_out, oom_killed,
  duration_ms, generation, generation_out, usage (cpu_ms, rss_max_kb: null when not
  measured), reads (null when not traced), writes, connections (counts), terminal (an
  interactive session of ``ccw capsule shell``).
- ``files.written``  seq, count, paths (the first ``MAX_PATHS``): at the end of an exec;
  and while it runs, where fanotify traces it, with ``live: true`` and ``seq`` null, the
  files closed after writing since the last progress report (about once a second); and
  for a merged capsule's changes, journaled at once (``merged``: its inputs, ``seq`` the
  first of ``count`` file-tool changes);
  ``files.read``  seq, count, dirs (the ``MAX_DIRS`` directories most read from, with
  counts).
- ``net.connection``  seq, host, port, protocol, allowed, rule, reason, bytes_in,
  bytes_out, cut: one per attempt, the first ``MAX_CONNECTIONS`` of an exec, at its end;
  and as each attempt is decided while the exec goes, with ``live: true``, ``seq`` null
  and no byte counts (``live_connection``).
- ``net.rules``  seq, at, who, allow, remove, caps, previous, rules, network: a capsule's
  allowlist changed while it lives (capsules/netlive.py).
- ``net.ask``  id, host, port, protocol, command, expires_at, ...: a connection no rule
  allows waits while a person is asked;  ``net.answer``  the same with state (once,
  capsule, denied, expired), who and reason (capsules/asks.py).
- ``file.changed``  seq, path, action (a file tool wrote, deleted, linked or chmodded).
- ``service``  name, state (starting, running, ready, exited, failed, lost, stopped), with
  argv and restarts as it starts, exit_code, signal and seq as a run ends; a service's
  run is also a ``run.finished`` with its ``service`` name.  ``port``  port, host_port,
  url, state (open, closed), or refused with the peer's uid and ``more`` (its refusals
  folded into this one since its last: one a second at most, capsules/ports.py).
- ``policy.report``  passed, report (promotion's checks, real or dry run);  ``promotion``
  applied, dry_run, refused (null, or the error's code and message: POLICY_FAILED,
  REPO_CHANGED, ...).
- ``witness``  witness_id, path, root_hash, size_bytes;  ``replay``  replay_ok,
  root_hash, output_identical, differences (the count of outputs that differ).
- ``deltamin.trial``  size (changes applied), outcome (fail, pass, unresolved), fresh (a
  confirmation run, never cached);  ``deltamin.done``  minimal (the hunks of the minimal
  patch), files (the files it changes), replay_ok, trials, cache_hits, elapsed_ms, one_minimal.
- ``race``  race_id, state (running, finished, failed, cancelled), and while running
  ended and total (capsules whose row is in): a race's record changed (capsules/races.py).

The table is bounded: the oldest rows beyond ``KEEP_EVENTS`` go when an ``EventLog`` opens it.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import sqlite3
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mcp_server.state import State

KINDS = ("capsule.created", "capsule.destroyed", "run.queued", "run.started", "run.failed", "run.finished",
         "files.written", "files.read", "net.connection", "file.changed", "policy.report", "promotion",
         "witness", "replay", "deltamin.trial", "deltamin.done", "service", "port", "net.rules",
         "net.ask", "net.answer", "race")
KEEP_EVENTS = 200_000
MAX_PATHS = 200
MAX_DIRS = 10
MAX_CONNECTIONS = 100
MAX_ERROR = 300  # characters of a failed call's error that its run.failed keeps
POLL_S = 0.1
LOOK_S = 1.0
BATCH = 500  # events a follower asks for at once
# json.dumps's own text, from one encoder: dumps makes a new one per call when given options
# (a merge's 2,000 file.changed events: 17 against 10 ms of encoding on this VM).
_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False)
_encode_string = json.encoder.encode_basestring  # the escaping _ENCODER gives a str (ensure_ascii=False)

_DDL = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    capsule_id TEXT,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_capsule ON events (capsule_id, id);
"""


@dataclass(frozen=True)
class Event:
    """One row of the stream."""

    id: int
    at: str  # ISO 8601 UTC, milliseconds
    capsule_id: str | None
    kind: str
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The event as the watchers and the dashboard receive it."""
        return {"id": self.id, "at": self.at, "capsule_id": self.capsule_id, "kind": self.kind, "data": self.data}


def ensure_schema(state: State) -> None:
    """The events table (once per process)."""
    state.ensure_schema("events", _DDL)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def emit(db: sqlite3.Connection, kind: str, capsule_id: str | None, data: Mapping[str, Any]) -> None:
    """Append one event inside the caller's transaction (``State.transaction``)."""
    emit_many(db, kind, capsule_id, [data])


def emit_many(db: sqlite3.Connection, kind: str, capsule_id: str | None, datas: Sequence[Mapping[str, Any]]) -> None:
    """``emit`` of each of ``datas``, in order, in one statement (a merge journals 2,000 files at once:
    one INSERT each cost it twice the time)."""
    emit_encoded(db, kind, capsule_id, [_ENCODER.encode(data) for data in datas])


def emit_encoded(db: sqlite3.Connection, kind: str, capsule_id: str | None, texts: Sequence[str]) -> None:
    """``emit_many`` of data already encoded as ``_ENCODER`` encodes it (``file_changed``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    at = _now()
    db.executemany("INSERT INTO events (at, capsule_id, kind, data) VALUES (?, ?, ?, ?)",
                   [(at, capsule_id, kind, text) for text in texts])


def file_changed(seq: int, path: str, action: str) -> str:
    """A ``file.changed`` event's data as ``_ENCODER`` writes it (keys sorted, the strings through
    the encoder's own escaping), without the dict and the encoder's walk over it: a merge journals
    2,000 files at once, and the walk was a tenth of its journaling."""
    return f'{{"action": {_encode_string(action)}, "path": {_encode_string(path)}, "seq": {int(seq)}}}'


def exec_events(seq: int, entry: Mapping[str, Any], generation_out: int | None) -> list[tuple[str, dict[str, Any]]]:
    """The events of one journaled exec (``Journal.add_exec``'s entry): finished, then what it
    wrote, read and tried to connect to."""
    touched = entry.get("touched") or {}
    written, read = touched.get("written") or [], touched.get("read")
    network = touched.get("network") or []
    usage = entry.get("usage") or {}
    events: list[tuple[str, dict[str, Any]]] = [("run.finished", {
        "seq": seq, "argv": entry.get("argv"), "cwd": entry.get("cwd"), "exit_code": entry.get("exit_code"),
        "signal": entry.get("signal"), "timed_out": bool(entry.get("timed_out")),
        "oom_killed": bool(entry.get("oom_killed")), "duration_ms": entry.get("duration_ms"),
        "generation": entry.get("generation"), "generation_out": generation_out,
        "usage": {"cpu_ms": usage.get("cpu_ms"), "rss_max_kb": usage.get("rss_max_kb")},
        "reads": None if read is None else len(read), "writes": len(written), "connections": len(network),
        "terminal": bool(entry.get("terminal")), **({"service": entry["service"]} if entry.get("service") else {}),
    })]
    if written:
        events.append(("files.written", {"seq": seq, "count": len(written), "paths": list(written[:MAX_PATHS])}))
    if read:
        dirs = collections.Counter(path.rsplit("/", 1)[0] if "/" in path else "." for path in read)
        events.append(("files.read", {"seq": seq, "count": len(read),
                                      "dirs": [[name, count] for name, count in dirs.most_common(MAX_DIRS)]}))
    for record in network[:MAX_CONNECTIONS]:
        events.append(("net.connection", {"seq": seq, **{key: record.get(key) for key in _CONNECTION}}))
    return events


_CONNECTION = ("host", "port", "protocol", "allowed", "rule", "reason", "bytes_in", "bytes_out", "cut")


def live_connection(record: Mapping[str, Any]) -> dict[str, Any]:
    """A connection attempt's event while its command runs (``live``, no exec number yet, its
    bytes still to come): the egress proxy's record once the attempt was decided."""
    return {"seq": None, "live": True, **{key: record.get(key) for key in _CONNECTION if not key.startswith("bytes")}}


def finished(result: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``result`` if it is a finished call's: None for none (the call failed) and for a run's
    ``running`` or ``cancelled`` summary (capsules/run.py), which no outcome event describes."""
    if result is None or result.get("status") in ("running", "cancelled"):
        return None
    return result


def add(state: State, kind: str, capsule_id: str | None, data: Mapping[str, Any]) -> None:
    """Append one event in a transaction of its own."""
    ensure_schema(state)
    with state.transaction() as db:
        emit(db, kind, capsule_id, data)


def record_outcome(state: State, capsule_id: str | None, found: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    """Append the events of a finished call, in one transaction (none: nothing is written).

    Which events a call makes is its tool's to say (``ToolSpec.outcome`` in
    mcp_server/tools/registry.py): this module knows the kinds, not the tools."""
    if found:
        ensure_schema(state)
        with state.transaction() as db:
            for kind, data in found:
                emit(db, kind, capsule_id, data)


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _event(row: sqlite3.Row) -> Event:
    return Event(int(row["id"]), row["at"], row["capsule_id"], row["kind"], json.loads(row["data"]))


class EventLog:
    """Reads (and, outside the journal's own transactions, appends) a state dir's events."""

    def __init__(self, state: State) -> None:
        self.state = state
        ensure_schema(state)
        state.execute("DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?", (KEEP_EVENTS,))

    def add(self, kind: str, capsule_id: str | None, data: Mapping[str, Any]) -> None:
        """Append one event in a transaction of its own."""
        add(self.state, kind, capsule_id, data)

    def last_id(self) -> int:
        """The id of the newest event (0 when there is none)."""
        (row,) = self.state.execute("SELECT COALESCE(MAX(id), 0) AS last FROM events")
        return int(row["last"])

    def since(self, after: int = 0, capsule_id: str | None = None, limit: int = 500) -> list[Event]:
        """Events with an id above ``after`` (of one capsule, if given), oldest first."""
        if capsule_id is None:
            rows = self.state.execute("SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?", (after, limit))
        else:
            rows = self.state.execute("SELECT * FROM events WHERE capsule_id = ? AND id > ? ORDER BY id LIMIT ?",
                                      (capsule_id, after, limit))
        return [_event(row) for row in rows]

    def latest(self, capsule_id: str | None = None, limit: int = 50, *, before: int | None = None,
               kinds: Sequence[str] = ()) -> list[Event]:
        """The newest ``limit`` events (of one capsule, if given; with an id below ``before``, if
        given; of ``kinds``, if any), oldest first."""
        where: list[str] = ["id < ?"]
        params: list[Any] = [before if before is not None else 2**62]
        if capsule_id:
            where.append("capsule_id = ?")
            params.append(capsule_id)
        if kinds:
            where.append(f"kind IN ({', '.join('?' for _ in kinds)})")
            params.extend(kinds)
        rows = self.state.execute(f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?",
                                  (*params, limit))
        return [_event(row) for row in reversed(rows)]

    async def follow(self, after: int, capsule_id: str | None = None,
                     poll_s: float = POLL_S) -> AsyncGenerator[Event, None]:
        """Every event after ``after`` as it is committed, by any process; never ends by itself."""
        async with contextlib.aclosing(self.follow_batches(after, capsule_id, poll_s)) as batches:
            async for batch in batches:
                for event in batch:
                    yield event

    async def follow_batches(self, after: int, capsule_id: str | None = None,
                             poll_s: float = POLL_S) -> AsyncGenerator[list[Event], None]:
        """``follow``'s events as each query found them: a reader that writes them out can
        do so once per batch."""
        import trio

        # A commit by any process changes the database's WAL file (or, after a
        # checkpoint, the database file): two stats say whether to look at all.
        # Timestamps are coarse (a clock tick) and a restarted WAL keeps its size, so
        # a change can hide: a look every LOOK_S anyway bounds how long.
        files = (f"{self.state.db_path}-wal", str(self.state.db_path))
        seen: tuple[tuple[int, int] | None, ...] | None = None
        looked = 0.0
        while True:
            stamp = tuple(_stamp(path) for path in files)
            batch: list[Event] = []
            if stamp != seen or trio.current_time() - looked >= LOOK_S:
                looked = trio.current_time()
                batch = await trio.to_thread.run_sync(self.since, after, capsule_id, BATCH)
            # The stamp was taken before the query, so a commit after the query changes it:
            # only a full batch may have more behind it already.  (Looking again after every
            # batch instead made a watcher of a busy capsule query without pause, at the
            # agent's expense: the CPU it took was the one the agent's commands ran on.)
            seen = None if len(batch) == BATCH else stamp
            if batch:
                after = batch[-1].id
                yield batch
            else:
                await trio.sleep(poll_s)
