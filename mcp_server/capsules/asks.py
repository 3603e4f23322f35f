"""Questions about the network, held while a person is asked (issue 37, "ask on a miss").

A connection that no rule of its capsule allows, where the capsule's network says
``on_miss: "ask"``, waits at the proxy's gate while a person decides.  This module keeps
the questions, in the state dir's database (``net_questions``), so that any process of
the state dir's user can answer one: ``ccw net approve`` / ``deny`` at a terminal, ``ccw
ui`` with its admin token, or the front end holding the connection, after its MCP client
answered an elicitation.  Whoever waits (``wait``) reads the row until it is answered or
its time is up.  Answers:

- ``once``: this connection (and every other waiting on the same question) passes; the
  rules stay as they were;
- ``capsule``: the rule is added to the capsule's live rules, by whoever waits
  (capsules/netlive.py ``record_change``, with the answer's ``who``), so later
  connections pass without asking;
- ``denied``: refused, with the person's reason for the agent;
- ``expired``: nobody answered in time (or nobody could be asked): refused, and the
  refusal says how to allow it.

What holds the jail back (THREATS.md, "Egress"): a jail decides what is asked, so every
field of a question is its text, bounded here; the questions are bounded too.  A
capsule has at most ``MAX_PENDING_PER_CAPSULE`` pending, the state dir ``MAX_PENDING``;
past either, a new question is refused at once (UNAVAILABLE), so 10,000 attempts at
unlisted hosts cost 10,000 refusals, not 10,000 questions.  The same host, port and
protocol asked again in one capsule while a question is pending is that question (its
``waiters`` counts them), so a retrying client does not ask twice.  Settled questions are
kept up to ``KEEP_ANSWERED`` (the connection records keep each answer anyway), so a
jail that asks for as long as it runs adds rows at a bounded rate and no more than that
in all.  Nothing here decides: the answer is a person's, and this module only records
who gave it.

A **proposal** (an agent's ``capsule_network {propose, reason}``: capsules/proposals.py)
is a row of the same table (``kind`` ``proposal``), so it waits in the same list and is
answered the same ways; its ``rules`` are what was proposed, its ``proposer`` who asked
(a token's name, or a uid), and ``once`` or ``capsule`` both approve it (a proposal is
about rules).  It has bounds of its own (``MAX_PROPOSALS_PER_CAPSULE``,
``MAX_PROPOSALS``), so an agent's proposals never take the places of its jail's
questions, nor the other way round.  ``applied`` says whether (and as which change) the
approved rules reached the capsule: ``claim`` lets exactly one process apply them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from mcp_server import events
from mcp_server.state import State
from sandbox.errors import CcwError

MAX_PENDING_PER_CAPSULE = 8
MAX_PENDING = 64
KEEP_ANSWERED = 1000  # settled questions kept (the newest); the runs' records keep each answer too
MAX_TEXT = 256  # characters of a host, a reason, a who; a command's argv is shown up to this
ANSWERS = ("once", "capsule", "denied")
MAX_PROPOSALS_PER_CAPSULE = 8
MAX_PROPOSALS = 32
PROPOSAL_S = 3600  # how long a proposal waits for a person (an agent polls it meanwhile)
_COLUMNS = {"net_questions": {"kind": "TEXT NOT NULL DEFAULT 'connection'", "rules": "TEXT", "proposer": "TEXT",
                              "applied": "TEXT"}}
POLL_S = 0.1  # how often a waiter reads its question's row

_DDL = """
CREATE TABLE IF NOT EXISTS net_questions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    capsule_id TEXT NOT NULL,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    protocol TEXT NOT NULL,
    command TEXT NOT NULL,
    asked_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    state TEXT NOT NULL,
    waiters INTEGER NOT NULL,
    reason TEXT,
    who TEXT,
    answered_at TEXT
);
CREATE INDEX IF NOT EXISTS net_questions_pending ON net_questions (state, capsule_id);
"""


@dataclass(frozen=True)
class Question:
    """One question, as the table holds it; ``state`` is ``pending`` until answered."""

    id: int
    capsule_id: str
    host: str
    port: int
    protocol: str
    command: str
    asked_at: str
    expires_at: str
    state: str
    waiters: int
    reason: str | None
    who: str | None
    answered_at: str | None
    kind: str = "connection"
    rules: tuple[str, ...] = ()  # a proposal's rules, as proposed (preset:NAME kept)
    proposer: str | None = None
    applied: str | None = None  # a proposal's: "change N", or why its rules could not be added

    @property
    def allowed(self) -> bool:
        """Whether the connections waiting on it pass."""
        return self.state in ("once", "capsule")

    @property
    def rule(self) -> str:
        """The rule that would allow it: ``host:port`` (an IPv6 literal in brackets); a
        proposal's rules, comma-separated."""
        if self.kind == "proposal":
            return ", ".join(self.rules)
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def to_json(self) -> dict[str, Any]:
        """The question as ``ccw net pending`` and the dashboard show it."""
        return {"id": self.id, "capsule_id": self.capsule_id, "host": self.host, "port": self.port,
                "protocol": self.protocol, "command": self.command, "asked_at": self.asked_at,
                "expires_at": self.expires_at, "state": self.state, "waiters": self.waiters,
                "reason": self.reason, "who": self.who, "answered_at": self.answered_at, "rule": self.rule,
                "kind": self.kind, **({"rules": list(self.rules), "proposer": self.proposer, "applied": self.applied}
                                      if self.kind == "proposal" else {})}

    def outcome(self) -> dict[str, Any]:
        """A proposal as the agent that made it reads it (capsule_network): its rules and its
        ``reason``; ``state`` (pending, approved, denied, expired), ``who`` answered and ``why``
        they denied it; ``applied``: how the rules went in."""
        return {"rules": list(self.rules), "reason": self.command, "proposer": self.proposer,
                "state": "approved" if self.allowed else self.state, "who": self.who, "why": self.reason,
                "applied": self.applied, "expires_at": self.expires_at}

    def refusal(self) -> str:
        """What a refused connection's record says, with how to allow it next time."""
        how = f"ccw capsule net {self.capsule_id} allow {self.rule}"
        if self.state == "denied":
            return f"denied by {self.who}: {self.reason or 'no reason given'} (to allow it: {how})"
        return f"nobody answered within the time to ask (to allow it: {how})"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _text(value: str) -> str:
    """A field a jail chose, bounded and single-line for a person's eyes."""
    flat = " ".join(str(value).split())
    return flat if len(flat) <= MAX_TEXT else flat[:MAX_TEXT - 1] + "…"


def _table(state: State) -> State:
    state.ensure_schema("net_questions", _DDL)
    state.add_columns(_COLUMNS)  # a state dir whose table predates proposals
    events.ensure_schema(state)
    return state


def _question(row: Any) -> Question:
    return Question(int(row["id"]), row["capsule_id"], row["host"], int(row["port"]), row["protocol"],
                    row["command"], row["asked_at"], row["expires_at"], row["state"], int(row["waiters"]),
                    row["reason"], row["who"], row["answered_at"], row["kind"],
                    tuple(json.loads(row["rules"])) if row["rules"] else (), row["proposer"], row["applied"])


def ask(state: State, capsule_id: str, host: str, port: int, protocol: str, command: Sequence[str],
        timeout_s: float) -> Question:
    """A pending question about ``host:port`` for the capsule: a new one, or the one already
    pending about the same host, port and protocol (one more waiter on it).

    UNAVAILABLE when the capsule, or the state dir, has as many pending as it may."""
    _table(state)
    now = _now()
    host, protocol = _text(host.lower()), _text(protocol)
    with state.transaction() as db:
        same = db.execute("SELECT * FROM net_questions WHERE state = 'pending' AND kind = 'connection' AND "
                          "capsule_id = ? AND host = ? AND port = ? AND protocol = ?",
                          (capsule_id, host, port, protocol)).fetchone()
        if same is not None:
            db.execute("UPDATE net_questions SET waiters = waiters + 1 WHERE id = ?", (same["id"],))
            return _question(db.execute("SELECT * FROM net_questions WHERE id = ?", (same["id"],)).fetchone())
        mine, every = _counts(db, "connection", capsule_id)
        if mine >= MAX_PENDING_PER_CAPSULE or every >= MAX_PENDING:
            which = (f"capsule {capsule_id} has {mine}" if mine >= MAX_PENDING_PER_CAPSULE
                     else f"this state dir has {every}")
            raise CcwError("UNAVAILABLE", f"{which} questions about the network pending; answer them "
                           "(ccw net pending) or allow the hosts (ccw capsule net CAP allow HOST:PORT)",
                           {"capsule_id": capsule_id, "host": host, "port": port})
        cursor = db.execute(
            "INSERT INTO net_questions (capsule_id, host, port, protocol, command, asked_at, expires_at, state, "
            "waiters) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', 1)",
            (capsule_id, host, port, protocol, _text(" ".join(command)), now.isoformat(timespec="milliseconds"),
             (now + dt.timedelta(seconds=timeout_s)).isoformat(timespec="milliseconds")))
        asked = _question(db.execute("SELECT * FROM net_questions WHERE id = ?", (cursor.lastrowid,)).fetchone())
        events.emit(db, "net.ask", capsule_id, asked.to_json())
        _forget(db)
    return asked


def _counts(db: Any, kind: str, capsule_id: str) -> tuple[int, int]:
    """How many of ``kind`` are pending: the capsule's, and the state dir's."""
    (mine,) = db.execute("SELECT COUNT(*) FROM net_questions WHERE state = 'pending' AND kind = ? AND capsule_id = ?",
                         (kind, capsule_id)).fetchone()
    (every,) = db.execute("SELECT COUNT(*) FROM net_questions WHERE state = 'pending' AND kind = ?",
                          (kind,)).fetchone()
    return int(mine), int(every)


def _forget(db: Any) -> None:
    """Keep the newest ``KEEP_ANSWERED`` rows (pending ones always)."""
    db.execute("DELETE FROM net_questions WHERE state != 'pending' AND id <= (SELECT MAX(id) FROM net_questions) - ?",
               (KEEP_ANSWERED,))


def propose(state: State, capsule_id: str, rules: Sequence[str], reason: str, proposer: str) -> Question:
    """A pending proposal of ``rules`` for the capsule: a new one, or the one already pending
    with the same rules (one more waiter on it).  UNAVAILABLE past the proposals' bounds."""
    _table(state)
    now = _now()
    kept = json.dumps(sorted(set(rules)))  # parsed by the caller: canonical rules and preset:NAME
    with state.transaction() as db:
        same = db.execute("SELECT * FROM net_questions WHERE state = 'pending' AND kind = 'proposal' AND "
                          "capsule_id = ? AND rules = ?", (capsule_id, kept)).fetchone()
        if same is not None:
            db.execute("UPDATE net_questions SET waiters = waiters + 1 WHERE id = ?", (same["id"],))
            return _question(db.execute("SELECT * FROM net_questions WHERE id = ?", (same["id"],)).fetchone())
        mine, every = _counts(db, "proposal", capsule_id)
        if mine >= MAX_PROPOSALS_PER_CAPSULE or every >= MAX_PROPOSALS:
            which = (f"capsule {capsule_id} has {mine}" if mine >= MAX_PROPOSALS_PER_CAPSULE
                     else f"this state dir has {every}")
            raise CcwError("UNAVAILABLE", f"{which} proposals pending; wait for a person's answer (poll one with "
                           "capsule_network proposal: ID) before proposing more",
                           {"capsule_id": capsule_id, "pending": mine})
        cursor = db.execute(
            "INSERT INTO net_questions (capsule_id, host, port, protocol, command, asked_at, expires_at, state, "
            "waiters, kind, rules, proposer) VALUES (?, ?, 0, 'proposal', ?, ?, ?, 'pending', 1, 'proposal', ?, ?)",
            (capsule_id, _text(", ".join(json.loads(kept))), _text(reason), now.isoformat(timespec="milliseconds"),
             (now + dt.timedelta(seconds=PROPOSAL_S)).isoformat(timespec="milliseconds"), kept, _text(proposer)))
        made = _question(db.execute("SELECT * FROM net_questions WHERE id = ?", (cursor.lastrowid,)).fetchone())
        events.emit(db, "net.ask", capsule_id, made.to_json())
        _forget(db)
    return made


def claim(state: State, question_id: int) -> bool:
    """Whether this caller is the one to add an approved proposal's rules (once, ever)."""
    with _table(state).transaction() as db:
        cursor = db.execute("UPDATE net_questions SET applied = 'applying' WHERE id = ? AND kind = 'proposal' "
                            "AND state = 'capsule' AND applied IS NULL", (question_id,))
        return cursor.rowcount == 1


def mark_applied(state: State, question_id: int, what: str) -> None:
    """Record how a claimed proposal's rules went in (``change N``, or why they could not)."""
    _table(state).execute("UPDATE net_questions SET applied = ? WHERE id = ?", (_text(what), question_id))


def answer(state: State, question_id: int, verdict: str, who: str, reason: str | None = None) -> Question:
    """Answer a pending question (``once``, ``capsule`` or ``denied``) as ``who``.

    NOT_FOUND for no such question; CONFLICT if it was answered already (or expired)."""
    if verdict not in ANSWERS:
        raise CcwError("INVALID_ARGUMENT", f"answer {verdict!r}: use one of {', '.join(ANSWERS)}")
    asked = get(state, question_id)
    if verdict == "once" and asked is not None and asked.kind == "proposal":
        verdict = "capsule"  # a proposal is about rules: approving it adds them
    return _settle(_table(state), question_id, verdict, _text(who), None if reason is None else _text(reason))


def _settle(state: State, question_id: int, verdict: str, who: str, reason: str | None) -> Question:
    with state.transaction() as db:
        row = db.execute("SELECT * FROM net_questions WHERE id = ?", (question_id,)).fetchone()
        if row is None:
            raise CcwError("NOT_FOUND", f"no question {question_id} about the network; ccw net pending lists "
                           "the open ones", {"id": question_id})
        if row["state"] != "pending":
            raise CcwError("CONFLICT", f"question {question_id} was answered already ({row['state']}, by "
                           f"{row['who']})", {"id": question_id, "state": row["state"]})
        db.execute("UPDATE net_questions SET state = ?, reason = ?, who = ?, answered_at = ? WHERE id = ?",
                   (verdict, reason, who, _now().isoformat(timespec="milliseconds"), question_id))
        settled = _question(db.execute("SELECT * FROM net_questions WHERE id = ?", (question_id,)).fetchone())
        events.emit(db, "net.answer", settled.capsule_id, settled.to_json())
    return settled


def get(state: State, question_id: int) -> Question | None:
    """One question, in whatever state."""
    rows = _table(state).execute("SELECT * FROM net_questions WHERE id = ?", (question_id,))
    return _question(rows[0]) if rows else None


def pending(state: State, capsule_id: str | None = None) -> list[Question]:
    """The questions waiting for an answer (of one capsule, if given), oldest first.
    Those past their time are settled as expired first: nobody waits on them any more."""
    expire(state)
    if capsule_id is None:
        rows = _table(state).execute("SELECT * FROM net_questions WHERE state = 'pending' ORDER BY id")
    else:
        rows = _table(state).execute("SELECT * FROM net_questions WHERE state = 'pending' AND capsule_id = ? "
                                     "ORDER BY id", (capsule_id,))
    return [_question(row) for row in rows]


def expire(state: State) -> None:
    """Settle as ``expired`` every pending question past its time (a waiter that died
    leaves its question behind; the next look ends it)."""
    late = _table(state).execute("SELECT id FROM net_questions WHERE state = 'pending' AND expires_at < ?",
                                 (_now().isoformat(timespec="milliseconds"),))
    for row in late:
        try:
            _settle(state, int(row["id"]), "expired", "nobody (the time to ask ran out)", None)
        except CcwError:
            pass  # answered meanwhile


async def wait(state: State, asked: Question) -> Question:
    """The answer to ``asked``, read from its row until it comes or its time is up (then
    it is settled as ``expired``, unless an answer won the race)."""
    deadline = dt.datetime.fromisoformat(asked.expires_at)
    while True:
        now = get(state, asked.id)
        if now is None:
            raise CcwError("NOT_FOUND", f"question {asked.id} is gone from the state dir", {"id": asked.id})
        if now.state != "pending":
            return now
        if _now() >= deadline:
            try:
                return _settle(state, asked.id, "expired", "nobody (the time to ask ran out)", None)
            except CcwError:
                continue  # answered at the last moment: read it
        await trio.sleep(POLL_S)

