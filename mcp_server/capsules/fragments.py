"""JSON-Schema fragments of the identifiers the capsule-family tools share.

Each tool keeps its own schemas beside it; these are the pieces several of them use
(a capsule id, a change generation, a witness id, a policy name), defined once so the
tools cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from sandbox.spec import CAPSULE_ID_RE

CAPSULE_ID: dict[str, Any] = {
    "type": "string",
    "pattern": f"^{CAPSULE_ID_RE.pattern}$",  # the one id grammar
}
GENERATION: dict[str, Any] = {
    "type": "integer",
    "minimum": 0,
    "description": "The capsule's change generation: every write to its contents (a file tool, a patch, "
                   "an exec that wrote) advances it. capsule_deltamin trusts only runs of the current one.",
}
WITNESS_ID: dict[str, Any] = {"type": "string", "pattern": "^wit_[0-9a-f]{16}$"}
PROBLEMS: dict[str, Any] = {"type": "array", "items": {"type": "object"}}
POLICY_NAME: dict[str, Any] = {"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]{0,63}$"}
