"""The capsule journal: every capsule the front end created and every exec run in it.

Witnesses, policies and delta minimisation read it, so it records what is needed to
re-run and to judge a run: argv, cwd, the environment's keys (never its values: they may
be secrets), exit status, blake3 of stdout/stderr, usage and touched sets.  Rows are
append-only; a capsule's runs are numbered from 1 in the order they finished (a service's
run has its name in ``service``; an exec's ``services`` holds the specs of the services
that ran beside it, JSON).  stdin is kept (a replay must feed it again); env values are not.
A new capsule, its destruction, each exec and each write is also an event
(``mcp_server.events``), emitted in its row's own transaction.

``capsule_base`` holds, for each path a capsule changed, what the base held there when
the change was first seen (kind, mode, blake3 or link target, or "absent").

Every write to a capsule's contents advances its change generation, by the rules of
``core/generations.py``; each exec and write row keeps the generations it started on and
produced.  The tables and their migration are ``journal_schema.py``; how a record becomes
a row and back is ``journal_records.py``; how a run is shown is ``journal_view.py``.

``exec_outputs`` keeps what each exec printed, so a witness can carry it and a replay can
show the lines that differ: the first ``OUTPUT_KEEP_BYTES`` of each stream (the helper's
default capture cap, so normally all it captured), zstd-compressed, with the cap in
force recorded.  It is bounded per exec, and a capsule's rows go when it is destroyed
(a witness can only be made of a live capsule); the hashes in ``execs`` stay.
"""

from __future__ import annotations

import json
from binascii import b2a_base64
from collections.abc import Sequence
from typing import Any

import zstandard

from mcp_server import events, journal_schema
from mcp_server.core.generations import exec_advances
from mcp_server.journal_records import (
    CapsuleRecord,
    capsule_record,
    capsule_row,
    exec_entry,
    exec_row,
)
from mcp_server.state import State
from sandbox.errors import CcwError

OUTPUT_KEEP_BYTES = 1 << 20  # per stream and exec


class Journal:
    """Reads and appends capsule and exec records in the state database."""

    def __init__(self, state: State) -> None:
        self.state = state
        journal_schema.ensure(state)
        events.ensure_schema(state)  # each row below is an event too, in its transaction

    def add_capsule(self, record: CapsuleRecord) -> None:
        """Record a new capsule."""
        row = capsule_row(record)
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self.state.transaction() as db:
            db.execute(f"INSERT OR REPLACE INTO capsules ({cols}) VALUES ({marks})", list(row.values()))
            events.emit(db, "capsule.created", record.capsule_id, {
                "workspace": record.workspace, "base": record.base, "parent": record.parent,
                "network": record.network, "expose": list(record.spec.expose)})

    def capsule(self, capsule_id: str) -> CapsuleRecord | None:
        """The record of one capsule, or None."""
        rows = self.state.execute("SELECT * FROM capsules WHERE capsule_id = ?", (capsule_id,))
        if not rows:
            return None
        return capsule_record(rows[0])

    def live_capsule(self, capsule_id: str, missing: str) -> CapsuleRecord:
        """The record of a capsule not destroyed; NOT_FOUND with the message ``missing``
        (which says what to call instead) when it is destroyed or unknown."""
        record = self.capsule(capsule_id)
        if record is None or record.destroyed_at is not None:
            raise CcwError("NOT_FOUND", missing, {"capsule_id": capsule_id})
        return record

    def mark_destroyed(self, capsule_id: str, when: str) -> None:
        """Note that a capsule is gone (its execs stay, for witnesses already made)."""
        with self.state.transaction() as db:
            db.execute("UPDATE capsules SET destroyed_at = ? WHERE capsule_id = ?", (when, capsule_id))
            db.execute("DELETE FROM exec_outputs WHERE capsule_id = ?", (capsule_id,))
            events.emit(db, "capsule.destroyed", capsule_id, {})

    def add_outputs(self, capsule_id: str, seq: int, streams: dict[str, bytes]) -> None:
        """Keep what exec ``seq`` printed (the first OUTPUT_KEEP_BYTES of each stream)."""
        with self.state.transaction() as db:
            self._add_outputs(db, capsule_id, seq, streams)

    @staticmethod
    def _add_outputs(db: Any, capsule_id: str, seq: int, streams: dict[str, bytes]) -> None:
        cctx = zstandard.ZstdCompressor(level=3)
        db.executemany("INSERT OR REPLACE INTO exec_outputs VALUES (?, ?, ?, ?, ?, ?)", [
            (capsule_id, seq, stream, cctx.compress(data[:OUTPUT_KEEP_BYTES]), min(len(data), OUTPUT_KEEP_BYTES),
             OUTPUT_KEEP_BYTES) for stream, data in sorted(streams.items())])

    def outputs(self, capsule_id: str, seq: int | None = None) -> dict[tuple[int, str], tuple[bytes, int]]:
        """What each exec (or exec ``seq`` alone) printed, as kept: (seq, stream) -> (bytes, cap in force)."""
        if seq is None:
            rows = self.state.execute("SELECT * FROM exec_outputs WHERE capsule_id = ?", (capsule_id,))
        else:
            rows = self.state.execute("SELECT * FROM exec_outputs WHERE capsule_id = ? AND seq = ?", (capsule_id, seq))
        dctx = zstandard.ZstdDecompressor()
        return {(row["seq"], row["stream"]): (dctx.decompress(row["zstd"]), row["cap"]) for row in rows}

    @staticmethod
    def _last_seq(db: Any, capsule_id: str) -> int:
        # Execs and writes share one sequence: a replay must redo them in this order.
        (last,) = db.execute(
            "SELECT MAX(COALESCE((SELECT MAX(seq) FROM execs WHERE capsule_id = ?), 0),"
            " COALESCE((SELECT MAX(seq) FROM writes WHERE capsule_id = ?), 0),"
            " COALESCE((SELECT MAX(seq + count - 1) FROM write_batches WHERE capsule_id = ?), 0))",
            (capsule_id, capsule_id, capsule_id),
        ).fetchone()
        return int(last)

    def add_write(self, capsule_id: str, path: str, action: str, content: bytes | None = None,
                  target: str | None = None, mode: int | None = None, mtime_ns: int | None = None) -> int:
        """Record a change made to a capsule by a file tool (not by a command).

        ``action`` is write | delete | symlink | chmod.  Replays redo these between the
        execs, so a witness of a capsule edited by tools still replays.  ``mtime_ns`` is
        the written file's mtime: a replay gives the file the same one, since a ``.pyc``
        compiled from it records its source's mtime.
        """
        return self.add_writes(capsule_id, [(path, action, content, target, mode, mtime_ns)])[0]

    def add_writes(self, capsule_id: str, writes: list[tuple[Any, ...]],
                   base: dict[str, str] | None = None, merged_from: Sequence[str] = ()) -> list[int]:
        """``add_write`` of each (path, action, content, target, mode, mtime_ns), in one transaction;
        with ``base``, ``record_base`` of it first, and with ``merged_from`` the capsules whose merge
        these writes are (``merged_from``), in the same transaction (a merge's: one COMMIT)."""
        with self.state.transaction() as db:  # a generation a row, as one call each would give (0: an unknown capsule)
            if base:
                self._record_base(db, capsule_id, base)
            if merged_from:
                db.execute("UPDATE capsules SET merged_from = ? WHERE capsule_id = ?",
                           (json.dumps(list(merged_from)), capsule_id))
            first, count, update = (self._last_seq(db, capsule_id) + 1, len(writes),
                                    "UPDATE capsules SET generation = generation + ?")
            gen, step = db.execute(f"{update} WHERE capsule_id = ? RETURNING generation - ?, 1",
                                   (count, capsule_id, count)).fetchone() or (0, 0)
            db.executemany("INSERT INTO writes (capsule_id, seq, path, action, content_b64, target, mode, generation, "
                           "mtime_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           [(capsule_id, first + i, p, a, c if c is None else b2a_base64(c, newline=False).decode(),
                             t, m, gen + step * (i + 1), n) for i, (p, a, c, t, m, n) in enumerate(writes)])
            events.emit_encoded(db, "file.changed", capsule_id,
                                [events.file_changed(first + i, w[0], w[1]) for i, w in enumerate(writes)])
        return list(range(first, first + count))

    def add_merge(self, capsule_id: str, writes: list[tuple[Any, ...]], base: dict[str, str],
                  merged_from: Sequence[str]) -> None:
        """``add_writes`` of a merge's changes, with its base states and its inputs, as one row of each
        (``write_batches``, ``capsule_base_batches``) and one ``files.written`` event: a merge journals
        thousands of paths at once, and SQLite's work a row was most of its journaling (2,000 writes,
        2,000 ``file.changed`` events and 2,000 base states took 29 ms in bench/parts/merge.py's merge;
        the one row of each, its text and bytes about a fifth of that).  Each write's bytes are the
        next ``size`` bytes of the batch's ``data``; ``writes`` gives each back as its own row.  A write may
        name, as a seventh item, the capsule whose view holds its bytes instead (``source``: a merge's
        input, frozen while the merged capsule lives, capsules/merge_write.py), read by its witness."""
        rows, data = [], []
        for path, action, content, target, mode, mtime_ns, *source in writes:
            rows.append((path, action, None if content is None else len(content), target, mode, mtime_ns, *source))
            if content is not None:
                data.append(content)
        with self.state.transaction() as db:
            db.execute("INSERT OR IGNORE INTO capsule_base_batches (capsule_id, states) VALUES (?, ?)",
                       (capsule_id, json.dumps(base, sort_keys=True)))
            db.execute("UPDATE capsules SET merged_from = ? WHERE capsule_id = ?",
                       (json.dumps(list(merged_from)), capsule_id))
            first, count = self._last_seq(db, capsule_id) + 1, len(writes)
            gen, step = db.execute("UPDATE capsules SET generation = generation + ? WHERE capsule_id = ? "
                                   "RETURNING generation - ?, 1", (count, capsule_id, count)).fetchone() or (0, 0)
            db.execute("INSERT INTO write_batches (capsule_id, seq, count, generation, step, rows, data) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", (capsule_id, first, count, gen + step, step,
                                                        json.dumps(rows), b"".join(data)))
            events.emit(db, "files.written", capsule_id, {"seq": first, "count": count, "merged": list(merged_from),
                                                          "paths": [row[0] for row in rows[:events.MAX_PATHS]]})

    def merged_from(self, capsule_id: str) -> list[str]:
        """The capsules a merged capsule holds the merge of (capsule_merge ``into``), none for any other:
        its promotion's policies judge their runs too (capsules/promote.py ``_facts``)."""
        rows = self.state.execute("SELECT merged_from FROM capsules WHERE capsule_id = ?", (capsule_id,))
        return list(json.loads(rows[0][0])) if rows and rows[0][0] else []

    def judged_with(self, record: CapsuleRecord, runs_of: Sequence[str] = ()) -> list[str]:
        """``runs_of`` and every capsule merged into ``record`` or its ancestors (``merged_from``), and into
        those, each once: a merged capsule's promotion judges what its inputs ran, as an into-live merge does."""
        found, seen, todo = list(runs_of), set(), [record]
        while todo:
            one: CapsuleRecord | None = todo.pop()
            while one is not None and one.capsule_id not in seen:  # up its line of parents
                seen.add(one.capsule_id)
                for merged in self.merged_from(one.capsule_id):
                    if merged not in found:
                        found.append(merged)
                    made = self.capsule(merged)
                    if made is not None:
                        todo.append(made)
                one = self.capsule(one.parent) if one.parent else None
        return found

    def writes(self, capsule_id: str) -> list[dict[str, Any]]:
        """Every file-tool change of a capsule, in order (a merge's batch, ``add_merge``, row by row)."""
        rows = [dict(row) for row in self.state.execute("SELECT * FROM writes WHERE capsule_id = ?", (capsule_id,))]
        for batch in self.state.execute("SELECT * FROM write_batches WHERE capsule_id = ?", (capsule_id,)):
            data, at = bytes(batch["data"]), 0
            for i, (path, action, size, target, mode, mtime_ns, *source) in enumerate(json.loads(batch["rows"])):
                content = None if size is None else b2a_base64(data[at:at + size], newline=False).decode()
                at += size or 0
                rows.append({"capsule_id": capsule_id, "seq": batch["seq"] + i, "path": path, "action": action,
                             "content_b64": content, "target": target, "mode": mode,
                             "generation": batch["generation"] + batch["step"] * i, "mtime_ns": mtime_ns,
                             **({"source": source[0]} if source and source[0] else {})})
        return sorted(rows, key=lambda row: row["seq"])

    @staticmethod
    def _generation(db: Any, capsule_id: str) -> int:
        row = db.execute("SELECT generation FROM capsules WHERE capsule_id = ?", (capsule_id,)).fetchone()
        return int(row[0]) if row is not None else 0

    @classmethod
    def _advance(cls, db: Any, capsule_id: str) -> int:
        db.execute("UPDATE capsules SET generation = generation + 1 WHERE capsule_id = ?", (capsule_id,))
        return cls._generation(db, capsule_id)

    def generation(self, capsule_id: str) -> int:
        """The capsule's current change generation (0 for an unknown capsule)."""
        with self.state.transaction() as db:
            return self._generation(db, capsule_id)

    def advance(self, capsule_id: str, running: str | None = None) -> int:
        """Advance the generation for a change the journal has no row for; the new one.

        For an exec that may have written but whose reply never came (cancelled while
        running, the helper died): its contents can no longer be vouched for.  ``running``:
        its ``mark_running`` note, dropped with it.
        """
        with self.state.transaction() as db:
            if running is not None:
                db.execute("DELETE FROM execs_running WHERE capsule_id = ? AND started_at = ?", (capsule_id, running))
            return self._advance(db, capsule_id)

    def add_exec(self, capsule_id: str, entry: dict[str, Any], outputs: dict[str, bytes] | None = None) -> int:
        """Append an exec record (and, with ``outputs``, what it printed); returns its sequence number."""
        return self.append_exec(capsule_id, entry, outputs)[0]

    def append_exec(self, capsule_id: str, entry: dict[str, Any],
                    outputs: dict[str, bytes] | None = None) -> tuple[int, int]:
        """Append an exec record, its events and ``outputs`` (``add_outputs``) in one transaction;
        its sequence number and the capsule's generation after it.

        ``entry["generation"]`` is the generation the exec started on (default: the
        current one); an exec that wrote, or whose writes are not fully known, advances
        the capsule's generation and records the new one as ``generation_out``.
        """
        with self.state.transaction() as db:
            last = self._last_seq(db, capsule_id)
            row = {"capsule_id": capsule_id, "seq": last + 1, **entry}
            current = self._generation(db, capsule_id)
            row.setdefault("generation", current)
            row["generation_out"] = self._advance(db, capsule_id) if exec_advances(entry["touched"]) else None
            columns = exec_row(row)
            cols = ", ".join(columns)
            marks = ", ".join("?" for _ in columns)
            db.execute(f"INSERT INTO execs ({cols}) VALUES ({marks})", list(columns.values()))
            db.execute("DELETE FROM execs_running WHERE capsule_id = ? AND started_at = ?",
                       (capsule_id, entry.get("started_at")))
            for kind, data in events.exec_events(last + 1, {"generation": row["generation"], **entry},
                                                row["generation_out"]):
                events.emit(db, kind, capsule_id, data)
            if outputs is not None:
                self._add_outputs(db, capsule_id, last + 1, outputs)
            return int(last + 1), current if row["generation_out"] is None else row["generation_out"]

    def mark_running(self, capsule_id: str, entry: dict[str, Any]) -> str:
        """Note an exec about to run as its row would be if its end never came (``entry``: a cut
        short one, capsules/exec.py ``cut_entry``).  ``append_exec`` of the same start drops the
        note; a front end killed before that leaves it to the next one's ``recover_running``.  Its key,
        for ``unmark_running``."""
        with self.state.transaction() as db:
            db.execute("INSERT OR REPLACE INTO execs_running (capsule_id, started_at, entry) VALUES (?, ?, ?)",
                       (capsule_id, entry["started_at"], json.dumps(entry)))
        return str(entry["started_at"])

    def unmark_running(self, capsule_id: str, started_at: str) -> None:
        """Drop ``mark_running``'s note of an exec the helper refused: it never ran."""
        with self.state.transaction() as db:
            db.execute("DELETE FROM execs_running WHERE capsule_id = ? AND started_at = ?", (capsule_id, started_at))

    def recover_running(self) -> list[tuple[str, int]]:
        """Journal, cut short, each exec a front end that died left noted (``mark_running``): it may
        have written anything, so its capsule's generation advances (a service's exec, like one the
        helper lost, has no row).  Only a state dir's starting front end calls this, before any
        exec.  The (capsule, seq) of each row written."""
        rows = self.state.execute("SELECT capsule_id, entry FROM execs_running ORDER BY started_at")
        recovered = []
        for row in rows:
            capsule_id, entry = row["capsule_id"], json.loads(row["entry"])
            record = self.capsule(capsule_id)
            if record is None or record.destroyed_at is not None:
                continue
            if entry.get("service"):  # as a service the helper lost: no row (capsules/services.py), unknown writes
                self.advance(capsule_id)
            else:
                recovered.append((capsule_id, self.append_exec(capsule_id, entry)[0]))
        with self.state.transaction() as db:
            db.execute("DELETE FROM execs_running")
        return recovered

    def record_base(self, capsule_id: str, states: dict[str, str]) -> None:
        """Remember what the base held at paths the capsule just changed (first record wins).

        Promotion compares these with the live workspace to detect that it moved
        underneath the capsule (REPO_CHANGED).
        """
        with self.state.transaction() as db:
            self._record_base(db, capsule_id, states)

    @staticmethod
    def _record_base(db: Any, capsule_id: str, states: dict[str, str]) -> None:
        db.executemany("INSERT OR IGNORE INTO capsule_base (capsule_id, path, state) VALUES (?, ?, ?)",
                       [(capsule_id, path, state) for path, state in sorted(states.items())])

    def base_states(self, capsule_id: str) -> dict[str, str]:
        """Every recorded base state of a capsule, by path (a merge's batch, recorded first, winning)."""
        rows = self.state.execute("SELECT path, state FROM capsule_base WHERE capsule_id = ?", (capsule_id,))
        batch = self.state.execute("SELECT states FROM capsule_base_batches WHERE capsule_id = ?", (capsule_id,))
        return {**{row["path"]: row["state"] for row in rows}, **(json.loads(batch[0]["states"]) if batch else {})}

    def known_paths(self, capsule_id: str) -> set[str]:
        """Paths with a recorded base state."""
        return set(self.base_states(capsule_id))

    def execs(self, capsule_id: str, *, before: int | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Every exec of a capsule, in order; or, with ``limit``, the newest ``limit`` of those
        numbered below ``before`` (a page of the dashboard), in order."""
        if limit is None and before is None:
            rows = self.state.execute("SELECT * FROM execs WHERE capsule_id = ? ORDER BY seq", (capsule_id,))
        else:  # the primary key (capsule_id, seq) walks the page backwards
            rows = self.state.execute("SELECT * FROM execs WHERE capsule_id = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
                                      (capsule_id, before if before is not None else 2**62, limit or -1))[::-1]
        return [exec_entry(row) for row in rows]
