"""The journal's record codec: a capsule's record and an exec's entry, as rows and back.

The capsules table predates ``CapsuleSpec``: its columns name the spec's fields as the
journal's readers do (``base`` is the directory the view starts from: the workspace
itself, read back as a spec without a base, or a snapshot).  Its ``network`` column holds
"none", as before allowlists, or the allowlist's canonical JSON; the helper is told only
that there is one (``helper_network``).  An exec's argv, environment keys (never their
values: they may be secrets), usage and touched sets are JSON text.  Every JSON column is
written with sorted keys, so a row's text is a function of its value.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from mcp_server.core.netrules import NetworkSpec, network_json, parse_network
from sandbox.spec import CapsuleSpec, Limits

_JSON_CAPSULE_FIELDS = ("env_whitelist", "limits", "isolation", "base_fingerprint")
_JSON_EXEC_FIELDS = ("argv", "env_keys", "usage", "touched")


@dataclass(frozen=True)
class CapsuleRecord:
    """A capsule as the journal knows it: the spec it was made from, and what became of it."""

    capsule_id: str
    spec: CapsuleSpec
    parent: str | None
    created_at: str
    clock: str
    isolation: dict[str, Any]
    mount: str
    base_fingerprint: dict[str, Any] | None
    destroyed_at: str | None
    generation: int = 0  # the change generation: every write to the capsule advances it
    network_spec: NetworkSpec | None = None  # the allowlist (spec.network is then "egress"); None: none
    volatile: tuple[str, ...] = ()  # globs of paths replay leaves out (core/volatile.py): not the helper's

    # The spec's fields as the journal's readers name them (and its columns hold them).
    @property
    def workspace(self) -> str:
        """Where the capsule's commands see their workspace."""
        return self.spec.workspace

    @property
    def base(self) -> str:
        """The directory the capsule's view starts from (the workspace, or a snapshot)."""
        return self.spec.lower

    @property
    def clock_offset_sec(self) -> int:
        """The capsule's clock offset from the real one."""
        return self.spec.clock_offset_sec

    @property
    def env_whitelist(self) -> list[str]:
        """The variables a command in the capsule may set."""
        return list(self.spec.env_whitelist)

    @property
    def limits(self) -> dict[str, Any]:
        """The capsule's limits as given (only those set)."""
        return self.spec.limits.to_json()

    @property
    def network(self) -> str | dict[str, Any]:
        """The capsule's network: "none" or its allowlist's canonical object (netrules.network_json)."""
        return network_json(self.network_spec)


def capsule_row(record: CapsuleRecord) -> dict[str, Any]:
    """The capsules table's row for ``record`` (its columns predate CapsuleSpec)."""
    row: dict[str, Any] = {
        "capsule_id": record.capsule_id, "workspace": record.workspace, "base": record.base,
        "parent": record.parent, "created_at": record.created_at, "clock": record.clock,
        "clock_offset_sec": record.clock_offset_sec, "env_whitelist": record.env_whitelist,
        "limits": record.limits, "network": network_column(record.network_spec), "isolation": record.isolation,
        "mount": record.mount, "base_fingerprint": record.base_fingerprint,
        "destroyed_at": record.destroyed_at, "generation": record.generation,
        "volatile": json.dumps(list(record.volatile)) if record.volatile else None,
        "expose": json.dumps(list(record.spec.expose)) if record.spec.expose else None,
        "gitdirs": json.dumps(list(record.spec.gitdirs)) if record.spec.gitdirs else None,
    }
    for key in _JSON_CAPSULE_FIELDS:
        row[key] = None if row[key] is None else json.dumps(row[key], sort_keys=True)
    return row


def capsule_record(row: Any) -> CapsuleRecord:
    """The record a capsules row (sqlite3.Row) holds."""
    data = dict(row)
    for key in _JSON_CAPSULE_FIELDS:
        data[key] = None if data[key] is None else json.loads(data[key])
    network_spec = network_from_column(data.pop("network"))
    data["volatile"] = tuple(json.loads(data.get("volatile") or "[]"))
    data.pop("merged_from", None)  # what a merged capsule merged: Journal.merged_from reads it
    spec = CapsuleSpec(
        workspace=data.pop("workspace"), given_base=data.pop("base"), clock_offset_sec=data.pop("clock_offset_sec"),
        env_whitelist=tuple(data.pop("env_whitelist")), limits=Limits(**data.pop("limits")),
        network=helper_network(network_spec), expose=tuple(json.loads(data.pop("expose", None) or "[]")),
        gitdirs=tuple(json.loads(data.pop("gitdirs", None) or "[]")),
    )
    if spec.given_base == spec.workspace:
        spec = dataclasses.replace(spec, given_base=None)
    return CapsuleRecord(spec=spec, network_spec=network_spec, **data)


def network_column(network_spec: NetworkSpec | None) -> str:
    """The ``network`` column: "none" (as before allowlists) or the allowlist's canonical JSON."""
    return "none" if network_spec is None else json.dumps(network_spec.to_json(), sort_keys=True)


def network_from_column(value: Any) -> NetworkSpec | None:
    """The allowlist a ``network`` column (or a witness's ``capsule.network``) holds; None for "none"."""
    if isinstance(value, str) and value != "none":
        value = json.loads(value)
    return parse_network(value)


def helper_network(network_spec: NetworkSpec | None) -> str:
    """The helper's CapsuleSpec.network for an allowlist (sandbox.spec.NETWORKS): it never sees the rules."""
    return "none" if network_spec is None else "egress"


def exec_row(entry: dict[str, Any]) -> dict[str, Any]:
    """The execs table's row for an exec's entry (numbered, its generations set)."""
    row = dict(entry)
    for key in _JSON_EXEC_FIELDS:
        row[key] = json.dumps(row[key], sort_keys=True)
    if row.get("written_mtimes") is not None:
        row["written_mtimes"] = json.dumps(row["written_mtimes"], sort_keys=True)
    return row


def exec_entry(row: Any) -> dict[str, Any]:
    """The entry an execs row (sqlite3.Row) holds."""
    data = dict(row)
    for key in _JSON_EXEC_FIELDS:
        data[key] = json.loads(data[key])
    data["timed_out"] = bool(data["timed_out"])
    data["oom_killed"] = bool(data["oom_killed"])
    data["terminal"] = bool(data.get("terminal"))  # ccw capsule shell: no output, no input kept
    # path -> mtime_ns of the files the exec wrote, as it left them (None: not known)
    data["written_mtimes"] = json.loads(data["written_mtimes"]) if data.get("written_mtimes") else None
    return data
