"""A capsule's allowlist changed while it lives: the store of rule sets and of who changed them.

``capsule_network`` (mcp_server/tools/network.py) lets a person add and remove a live
capsule's rules; the egress session judges the next connection by them and cuts those
they no longer allow (egress/session.py).  This module is what stays of each change:

- **Rule sets by id.**  Each set of rules and caps a capsule ever had is kept in
  ``network_rules`` under its ``netrules.rules_id`` (a hash of its canonical form), once
  however many capsules share it.  Every connection record names the id it was decided
  by (``touched.network[].rules``), so a run's record says which rules were in force,
  and ``spec`` looks the rules up again.
- **Changes by capsule.**  ``network_changes`` has one row per change: when, who (the
  HTTP token's name, or the uid of the socket's or terminal's user, and which client),
  what was added and removed, the ids before and after.  The capsule's journal row
  (``capsules.network``) is updated in the same transaction, so the next front end (each
  ``ccw`` command is a process) and the next exec open the session with the new rules,
  and a ``net.rules`` event tells watchers.  One transaction, so no watcher sees a
  change the journal does not hold.
- **The rules of a run.**  ``in_force`` gives, for a moment, the id of the rules then in
  force: the last change made before it, else the rules the capsule was made with (the
  first change's ``previous``), else its rules now.  A witness names, per exec, the ids in
  force as it started and those its connections name (a change may come while it runs),
  with each id's rules (capsules/witness.py), so a replay can run it under them.

Who may change rules is decided by the caller (capsule_network: the ``admin`` scope over
HTTP, a person's power, never an agent's token); this module records the answer.  Every
change goes through ``change_rules`` (journal, then session, in order), with its ``who``:
an answer to a question or an approved proposal as much as the tool.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mcp_server import events
from mcp_server.capsules import capsecrets
from mcp_server.capsules.networks import Networks
from mcp_server.core.netrules import NetworkSpec, changed, parse_network, rules_id
from mcp_server.journal_records import network_column, network_from_column
from mcp_server.state import State
from sandbox.errors import CcwError

_DDL = """
CREATE TABLE IF NOT EXISTS network_rules (
    rules_id TEXT PRIMARY KEY,
    spec TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS network_changes (
    capsule_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    at TEXT NOT NULL,
    who TEXT NOT NULL,
    allow TEXT NOT NULL,
    remove TEXT NOT NULL,
    caps TEXT,
    previous TEXT NOT NULL,
    rules_id TEXT NOT NULL,
    PRIMARY KEY (capsule_id, seq)
);
"""


@dataclass(frozen=True)
class Change:
    """One change as it was recorded; ``spec`` is the capsule's rules after it."""

    capsule_id: str
    seq: int
    at: str
    who: str
    allow: list[str]
    remove: list[str]
    caps: dict[str, int] | None
    previous: str
    rules: str
    spec: NetworkSpec

    def to_json(self) -> dict[str, Any]:
        """The change as capsule_network and ``ccw capsule net`` show it."""
        return {"seq": self.seq, "at": self.at, "who": self.who, "allow": self.allow, "remove": self.remove,
                "caps": self.caps, "previous": self.previous, "rules": self.rules}


def _table(state: State) -> State:
    state.ensure_schema("network_rules", _DDL)
    return state


def now() -> str:
    """A change's time, in the form the journal's ``started_at`` has (so they compare as text)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def _remember(db: Any, spec: NetworkSpec) -> str:
    ident = rules_id(spec)
    db.execute("INSERT OR IGNORE INTO network_rules (rules_id, spec) VALUES (?, ?)",
               (ident, json.dumps(spec.to_json(), sort_keys=True)))
    return ident


def record_change(state: State, capsule_id: str, change: Callable[[NetworkSpec], NetworkSpec], who: str,
                  asked: Mapping[str, Any]) -> Change | None:
    """Apply ``change`` to the capsule's rules as the journal holds them, in one transaction
    with the change's row, the journal's and the event; None when it changes nothing.

    ``asked``: what was asked (allow, remove, caps), as the row keeps it.  The rules are
    read inside the transaction, so two changes at once each build on the other's.
    """
    _table(state)
    events.ensure_schema(state)
    with state.transaction() as db:
        row = db.execute("SELECT network, destroyed_at FROM capsules WHERE capsule_id = ?", (capsule_id,)).fetchone()
        if row is None or row["destroyed_at"] is not None:
            raise CcwError("NOT_FOUND", f"no live capsule {capsule_id}; capsule_list shows the live ones",
                           {"capsule_id": capsule_id})
        old = network_from_column(row["network"])
        if old is None:
            raise none_refusal(capsule_id)
        new = change(old)
        if new == old:
            return None
        previous, ident = _remember(db, old), _remember(db, new)
        (last,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM network_changes WHERE capsule_id = ?",
                             (capsule_id,)).fetchone()
        made = Change(capsule_id, int(last) + 1, now(), who, list(asked.get("allow") or []),
                      list(asked.get("remove") or []), dict(asked["caps"]) if asked.get("caps") else None,
                      previous, ident, new)
        db.execute("INSERT INTO network_changes (capsule_id, seq, at, who, allow, remove, caps, previous, rules_id) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (capsule_id, made.seq, made.at, who, json.dumps(made.allow), json.dumps(made.remove),
                    None if made.caps is None else json.dumps(made.caps, sort_keys=True), previous, ident))
        db.execute("UPDATE capsules SET network = ? WHERE capsule_id = ?", (network_column(new), capsule_id))
        events.emit(db, "net.rules", capsule_id, {**made.to_json(), "network": new.to_json()})
    return made


async def change_rules(networks: Networks, state: State, capsule_id: str, who: str, *,
                       allow: Iterable[Any] = (), remove: Iterable[Any] = (), caps: Mapping[str, Any] | None = None,
                       asked: Mapping[str, Any] | None = None) -> tuple[Change | None, list[dict[str, Any]]]:
    """The one way rules change while a capsule lives (capsule_network; an answer to a question or a
    proposal later): journaled (``record_change``), then handed to the capsule's session, under
    ``networks.rules_lock`` so sessions get changes in the journal's order.  The change (None:
    nothing changed) and the records of the connections it cut.  ``allow``/``remove``: rules
    (presets already expanded); ``asked``: what to keep as asked (default: allow, remove, caps)."""
    allow, remove = list(allow), list(remove)
    kept = asked if asked is not None else {"allow": allow, "remove": remove, "caps": caps}
    check = capsecrets.terminable(state.root, capsule_id)  # an https rule needs a CA bundle shown at create
    async with networks.rules_lock:
        made = record_change(state, capsule_id, lambda old: check(old, changed(old, allow, remove, caps)), who, kept)
        if made is not None:  # a new https rule's host: a CA for it, before the session lets a CONNECT there
            await capsecrets.extend(state.root, networks, capsule_id, made.spec)
        cut = [] if made is None else await networks.set_rules(capsule_id, made.spec, who) or []
    return made, cut


def none_refusal(capsule_id: str) -> CcwError:
    """Why a capsule made with ``network: none`` gets no allowlist while it lives, and what to do."""
    return CcwError(
        "UNSUPPORTED",
        f"capsule {capsule_id} was made with network none: it has no egress side (no proxy, no way out of "
        "its loopback-only namespace, where its services run too), and none can be added while it lives. "
        "Make a capsule with the allowlist (capsule_create with network: [rules]; ccw capsule create "
        "--network RULE) and carry this one's work over (capsule_diff's patch, or promote it first)",
        {"capsule_id": capsule_id, "network": "none", "reason": "no_egress_side"},
    )


def changes(state: State, capsule_id: str) -> list[Change]:
    """The capsule's changes, oldest first."""
    rows = _table(state).execute(
        "SELECT c.*, r.spec FROM network_changes c JOIN network_rules r ON r.rules_id = c.rules_id "
        "WHERE c.capsule_id = ? ORDER BY c.seq", (capsule_id,))
    return [Change(row["capsule_id"], row["seq"], row["at"], row["who"], json.loads(row["allow"]),
                   json.loads(row["remove"]), None if row["caps"] is None else json.loads(row["caps"]),
                   row["previous"], row["rules_id"], _parsed(row["spec"])) for row in rows]


def _parsed(text: str) -> NetworkSpec:
    spec = parse_network(json.loads(text))
    assert spec is not None  # only allowlists are kept
    return spec


def spec(state: State, ident: str) -> NetworkSpec | None:
    """The rules kept under ``ident``, or None if this state dir never had them."""
    rows = _table(state).execute("SELECT spec FROM network_rules WHERE rules_id = ?", (ident,))
    return _parsed(rows[0]["spec"]) if rows else None


def in_force(history: list[Change], current: NetworkSpec, at: str) -> str:
    """The id of the rules in force at ``at`` (ISO, as ``now``), given the capsule's ``history``."""
    before = [change for change in history if change.at <= at]
    if before:
        return before[-1].rules
    return history[0].previous if history else rules_id(current)


# --- witnesses and replays ---------------------------------------------------------


def mark_witness(manifest: dict[str, Any], state: State, record: Any, execs: list[dict[str, Any]]) -> None:
    """Name in a witness's ``manifest`` the rules each exec ran under (``execs[].rules``: ids)
    and each of those rule sets (``capsule.network_rules``); nothing for a capsule without network.

    An exec's ids are those in force as it started and those its connections name (a change
    may have come while it ran).
    """
    current = record.network_spec
    if current is None:
        return
    history = changes(state, record.capsule_id)
    used: dict[str, NetworkSpec] = {rules_id(current): current}
    for change in history:
        used.setdefault(change.rules, change.spec)
    started = {ex["seq"]: ex["started_at"] for ex in execs}
    kept: dict[str, Any] = {}
    for entry in manifest["execs"]:
        ids = {in_force(history, current, started[entry["seq"]])}
        ids |= {str(r["rules"]) for r in entry["touched"].get("network") or () if r.get("rules")}
        entry["rules"] = sorted(ids)
        for ident in ids:
            found = used.get(ident) or spec(state, ident)
            if found is not None:
                kept[ident] = found.to_json()
    manifest["capsule"]["network_rules"] = kept


def _recorded(manifest: dict[str, Any]) -> dict[int, tuple[list[str], NetworkSpec]]:
    """Each exec's recorded rule ids and the rules they allow together (the first id's caps);
    INVALID_ARGUMENT for a witness whose ids and rule sets do not agree."""
    sets: dict[str, NetworkSpec] = {}
    for ident, value in (manifest["capsule"].get("network_rules") or {}).items():
        parsed = parse_network(value)
        if parsed is None or rules_id(parsed) != ident:
            raise CcwError("INVALID_ARGUMENT", f"the witness's capsule.network_rules[{ident!r}] is not the rule set "
                           "that id names; the witness was altered or made by another tool", {"rules": ident})
        sets[ident] = parsed
    out = {}
    for entry in manifest["execs"]:
        ids = entry.get("rules")
        if not ids:
            continue
        unknown = [ident for ident in ids if ident not in sets]
        if unknown:
            raise CcwError("INVALID_ARGUMENT", f"the witness's exec {entry['seq']} names rules {unknown} it does not "
                           "carry (capsule.network_rules)", {"exec": entry["seq"], "rules": unknown})
        first = sets[ids[0]]
        rules = tuple(sorted({rule for ident in ids for rule in sets[ident].allow}))
        out[entry["seq"]] = (list(ids), NetworkSpec(rules, first.max_bytes, first.max_connections))
    return out


def replay_rules(manifest: dict[str, Any], grant: NetworkSpec | None,
                 own: bool) -> tuple[NetworkSpec | None, dict[int, NetworkSpec]]:
    """The network a replay's capsule is made with, and the rules each exec runs under.

    The witness's recorded rules are used, never more than the replayer allows: ``grant``
    (its ``network``; None: network none, and the execs run without, as before live rules),
    or, with ``own`` (a signed witness of this state dir replayed for its capsule's policy),
    every rule the witness recorded.  PERMISSION_DENIED naming the exec, its rules and
    what the grant lacks when a recorded rule is outside it.
    """
    recorded = _recorded(manifest)
    if own and recorded:
        every = {rule for _, spec_ in recorded.values() for rule in spec_.allow}
        first = next(iter(recorded.values()))[1]
        grant = NetworkSpec(tuple(sorted(every)), first.max_bytes, first.max_connections)
    if grant is None:
        return None, {}
    for seq, (ids, spec_) in sorted(recorded.items()):
        lacking = [rule.text for rule in spec_.allow if rule not in grant.allow]
        if lacking:
            raise CcwError(
                "PERMISSION_DENIED",
                f"the witness's exec {seq} ran under rules {', '.join(ids)} ({spec_.rules_text()}); the network this "
                f"replay may use lacks {lacking}: pass a network with them (capsule_replay network; ccw capsule "
                "replay --network RULE), or none to replay without network",
                {"exec": seq, "rules": ids, "recorded": [rule.text for rule in spec_.allow], "lacking": lacking})
    return grant, {seq: NetworkSpec(spec_.allow, min(spec_.max_bytes, grant.max_bytes),
                                    min(spec_.max_connections, grant.max_connections))
                   for seq, (_, spec_) in recorded.items()}
