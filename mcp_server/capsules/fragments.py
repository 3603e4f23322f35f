"""JSON-Schema fragments of the identifiers the capsule-family tools share.

Each tool keeps its own schemas beside it; these are the pieces several of them use
(a capsule id, a change generation, a witness id, a policy name, a network), defined once so the
tools cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from sandbox.checks import CAPSULE_ID_RE

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
_RULES: dict[str, Any] = {
    "type": "array", "minItems": 1, "maxItems": 1024, "items": {"type": "string", "minLength": 1, "maxLength": 300},
}
_CAPS: dict[str, Any] = {"type": "integer", "minimum": 1}
NETWORK_GRANT: dict[str, Any] = {  # what a replay may use (capsule_replay): the rules and caps, never asking
    "anyOf": [
        {"enum": ["none", None]},
        _RULES,
        {"type": "object", "required": ["allow"], "additionalProperties": False,
         "properties": {"allow": _RULES, "max_bytes": _CAPS, "max_connections": _CAPS}},
    ],
}
NETWORK_IN: dict[str, Any] = {  # a capsule's network (capsule_create): a grant, and what a miss gets
    "anyOf": [
        *NETWORK_GRANT["anyOf"][:2],
        {"type": "object", "required": ["allow"], "additionalProperties": False, "properties": {
            "allow": _RULES, "max_bytes": _CAPS, "max_connections": _CAPS,
            "on_miss": {"enum": ["deny", "ask"]}, "ask_timeout_ms": {"type": "integer"}, "policy": {"type": "string"},
        }},
    ],
    "description": (
        "'none' (default: loopback only), or an allowlist reached through ccw's proxy (HTTP_PROXY, "
        "HTTPS_PROXY, ALL_PROXY are set). Rules: host[:port], *.domain[:port], a.b.c.d[/n][:port], "
        "[v6[/n]]:port; no port: 80 and 443; preset:NAME is a named set (pypi, npm, debian, crates, go, "
        "github). The host itself and private or reserved space are refused, by name or CIDR, unless a "
        "rule names that exact address:port. Object: {allow, max_bytes, max_connections} (per exec; "
        "1 GiB, 512), on_miss: ask (a person decides a miss)."
    ),
}
RUN_LIMITS: dict[str, Any] = {  # what one run may be held to below its capsule's limits (a service's)
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "memory_mb": {"type": "integer", "minimum": 1, "maximum": 1 << 20},
        "pids_max": {"type": "integer", "minimum": 1, "maximum": 1 << 22},
        "cpu_ms": {"type": "integer", "minimum": 1},
    },
}
