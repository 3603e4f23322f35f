"""The witness manifest's schema (``ccw-witness/1``), and the check every manifest passes before use.

A witness comes from anyone, so its manifest is untrusted input: every field a replay
or a verification reads is typed and bounded here, and ``check`` runs before any of
them is used.  A manifest that fails is INVALID_ARGUMENT naming the field (a JSON
pointer) and what was expected, never a KeyError or TypeError deep in a replay.

Choices:

- **Open objects.** Unknown fields are allowed everywhere (a newer ccw may add some,
  as this one added ``writes`` and ``output``): nothing reads them, and the root hash
  covers them all the same.  Fields added since the first witnesses are optional.
- **Integers are integers.** JSON Schema counts ``1.0`` as an integer; a mode or an
  mtime of ``420.0`` would reach ``os.fchmod`` as a float.  The validator here takes
  only ``int`` (and never ``bool``).
- **Paths** the replay writes (base files, changes, writes, recorded mtimes) are
  repo-relative: no leading ``/``, no empty, ``.`` or ``..`` component, no NUL, at most
  4096 characters; ``.`` alone is the root.  The replay writes through RootView anyway
  (RESOLVE_BENEATH); this says what is wrong before anything is written.
- **Numbers** are bounded to what the host can take: modes to 0o7777, owners (a base
  entry's optional ``uid``/``gid`` and the top's, capsules/owners.py) to 0..2**32-2, mtimes to
  ±2**62 ns (±146 years around 1970), timeouts and clock offsets to sandbox.checks'
  limits, capsule limits by ``Limits.from_json``.
- **The recorded network** is only reported by a replay, never used; it is "none" or
  an object.
- **Services** an exec ran beside (``execs[].services``, capsules/service_spec.py's
  witness form) are started by its replay, so each is bounded as the helper bounds what
  it would get: at most ``MAX_SERVICES`` per exec, names by the helper's grammar and
  unique per exec, argv as an exec's argv (``sandbox.checks.argv``: entries, bytes, a
  program name), an absolute cwd, variable names only, limits by ``Limits.from_json``,
  one readiness condition whose pattern compiles.  An exec of a service
  (``execs[].service``, its name) is never re-run; its ``timeout_ms`` is 0 (none).
- **An interactive exec's steps** (``execs[].console``, capsules/console.py ``record``)
  say when a replay types each part of its stdin: counts of bytes, each at most
  ``MAX_STDIN``, at most one step a byte of it.  Steps that ask for more than the stdin
  holds type what there is; one whose output never comes waits only until output pauses.
"""

from __future__ import annotations

import itertools
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.validators import extend

from mcp_server.core.schemapattern import Validator
from mcp_server.core.volatile import GLOBS_SCHEMA
from sandbox.checks import (
    ENV_NAME_RE,
    MAX_ARGV,
    MAX_BINDS,
    MAX_CLOCK_OFFSET_SEC,
    MAX_ENV,
    MAX_PATH,
    MAX_STDIN,
    MAX_TIMEOUT_MS,
    argv,
)
from sandbox.errors import CcwError
from sandbox.spec import Limits

FORMAT = "ccw-witness/1"
MAX_REPORTED = 5  # schema errors named in one message (a hostile manifest may hold millions)
MAX_SERVICES = 16  # services named beside one exec
# A service's own grammar and bounds, as the helper's exec op (sandbox/ops.py, which core may not
# import) and capsules/service_spec.py take them (tests/test_witness_manifest.py holds them equal):
# its name, its restart policies, a readiness line's length (text looked for, not a pattern:
# no regular expression chosen by a witness runs on output it also chose), a readiness deadline.
SERVICE_NAME_PATTERN = r"[a-z0-9][a-z0-9_.-]{0,62}"
SERVICE_RESTARTS = ("no", "on-failure", "always")
SERVICE_READY_LINE_MAX = 512
SERVICE_READY_TIMEOUT_MAX_MS = 600_000

_HASH = {"type": "string", "pattern": "^blake3:[0-9a-f]{64}$"}
_HASH_OR_NULL = {"anyOf": [_HASH, {"type": "null"}]}
# A repo-relative path: "." alone, or components that are not empty, "." or "..", no leading "/".
_REL_PATH = {
    "type": "string",
    "pattern": r"^(?:\.|(?!/)(?![\s\S]*//)(?!(?:[\s\S]*/)?\.\.?(?:/|$))(?![\s\S]*/$)[^\x00]{1,4096})$",
}
_MODE = {"type": "integer", "minimum": 0, "maximum": 0o7777}
_ID = {"type": "integer", "minimum": 0, "maximum": (1 << 32) - 2}  # (uid_t)-1 is chown's "unchanged"
_MTIME = {"type": ["integer", "null"], "minimum": -(1 << 62), "maximum": 1 << 62}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 1 << 53}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_STRINGS_OR_NULL = {"type": ["array", "null"], "items": {"type": "string"}}
_ENV_NAMES = {"type": "array", "items": {"type": "string", "pattern": f"^{ENV_NAME_RE.pattern}$"}}


def _when(field: str, value: str, then: dict[str, Any]) -> dict[str, Any]:
    """``if field == value then ...``: the fields one kind of entry must have."""
    return {"if": {"properties": {field: {"const": value}}, "required": [field]}, "then": then}


_BASE_ENTRY = {
    "type": "object",
    "required": ["path", "type", "mode"],
    "properties": {
        "path": _REL_PATH, "type": {"enum": ["file", "dir", "symlink"]}, "mode": _MODE,
        "blob": _HASH, "mtime_ns": _MTIME, "target": {"type": "string", "minLength": 1}, "size": _COUNT,
        "uid": _ID, "gid": _ID,  # absent in witnesses made before owners were recorded
    },
    "allOf": [_when("type", "file", {"required": ["blob"]}), _when("type", "symlink", {"required": ["target"]})],
}
# The workspace directory itself, which base.files (repo paths below it) cannot name: the
# jail's top shows its mode and owner, and git judges "dubious ownership" by that owner.
_BASE_TOP = {
    "type": "object",
    "required": ["mode", "uid", "gid"],
    "properties": {"mode": _MODE, "uid": _ID, "gid": _ID},
}
_NETWORK_RECORD = {
    "type": "object",
    "required": ["host", "port", "protocol", "allowed"],
    "properties": {"host": {"type": "string"}, "port": {"type": "integer"}, "protocol": {"type": "string"},
                   "allowed": {"type": "boolean"}},
}
_KEPT = {
    "type": "object",
    "required": ["blob", "kept_bytes", "cap"],
    "properties": {"blob": _HASH, "kept_bytes": _COUNT, "cap": _COUNT},
}
_SERVICE_READY = {
    "type": "object",
    "properties": {
        "port": {"type": "integer", "minimum": 1, "maximum": 65535},  # TCP's
        "path": {"type": "string", "minLength": 1, "maxLength": MAX_PATH, "pattern": "^[^\\x00]*$"},
        "line": {"type": "string", "minLength": 1, "maxLength": SERVICE_READY_LINE_MAX},
        "timeout_ms": {"type": "integer", "minimum": 1, "maximum": SERVICE_READY_TIMEOUT_MAX_MS},
    },
    "oneOf": [{"required": ["port"]}, {"required": ["path"]}, {"required": ["line"]}],
}
# One service beside an exec, in its witness form (ServiceSpec.for_witness: env names, never values).
_SERVICE = {
    "type": "object",
    "required": ["name", "argv"],
    "properties": {
        "name": {"type": "string", "pattern": f"^{SERVICE_NAME_PATTERN}$"},
        "argv": {"type": "array", "minItems": 1, "maxItems": MAX_ARGV, "items": {"type": "string"}},
        "cwd": {"type": ["string", "null"], "maxLength": MAX_PATH, "pattern": "^/[^\\x00]*$"},
        "env": {**_ENV_NAMES, "maxItems": MAX_ENV},
        "ready": _SERVICE_READY,
        "limits": {"type": "object"},  # each limit checked by sandbox.spec.Limits
        "restart": {"enum": list(SERVICE_RESTARTS)},
    },
}
_STDIN_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_STDIN}
_CONSOLE = {
    "type": "object",
    "required": ["tty", "steps"],
    "properties": {
        "tty": {"type": "boolean"},
        # [output bytes before it, bytes typed]; the output count is the replayed run's, unbounded but an int
        "steps": {"type": "array", "maxItems": MAX_STDIN,
                  "items": {"type": "array", "prefixItems": [_COUNT, _STDIN_COUNT], "minItems": 2, "maxItems": 2}},
        "eof": {"type": ["integer", "null"], "minimum": 0, "maximum": 1 << 53},
    },
}
_EXEC = {
    "type": "object",
    "required": ["seq", "argv", "cwd", "exit_code", "signal", "timed_out", "stdout_blake3", "stderr_blake3",
                 "stdout_bytes", "stderr_bytes", "touched"],
    "properties": {
        "seq": _COUNT,
        "argv": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "cwd": {"type": ["string", "null"]},
        "env_keys": _ENV_NAMES,
        "exit_code": {"type": ["integer", "null"]},
        "signal": {"type": ["string", "null"]},
        "timed_out": {"type": "boolean"},
        "oom_killed": {"type": "boolean"},
        "stdout_blake3": _HASH, "stderr_blake3": _HASH, "stdout_bytes": _COUNT, "stderr_bytes": _COUNT,
        "timeout_ms": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_TIMEOUT_MS},
        "stdin_blob": _HASH_OR_NULL,
        "touched": {
            "type": "object",
            "required": ["written"],
            "properties": {"read": _STRINGS_OR_NULL, "written": _STRINGS, "listed": _STRINGS_OR_NULL,
                           "executed": _STRINGS_OR_NULL,
                           "network": {"type": ["array", "null"], "items": _NETWORK_RECORD}},
        },
        "output": {
            "type": ["object", "null"],
            "properties": {"stdout": _KEPT, "stderr": _KEPT},
            "additionalProperties": False,  # the replay walks its keys as stream names
        },
        "written_mtimes": {
            "type": ["object", "null"],
            "propertyNames": _REL_PATH,
            "additionalProperties": {"type": "integer", "minimum": -(1 << 62), "maximum": 1 << 62},
        },
        "services": {"type": "array", "maxItems": MAX_SERVICES, "items": _SERVICE},  # absent: none ran beside it
        "service": {"type": "string", "pattern": f"^{SERVICE_NAME_PATTERN}$"},  # a service's exec: never re-run
        "console": _CONSOLE,  # absent: not interactive
    },
    # Only a service's exec has no time limit (0); a command a replay runs always has one.
    "if": {"required": ["service"]}, "else": {"properties": {"timeout_ms": {"minimum": 1}}},
}
_WRITE = {
    "type": "object",
    "required": ["seq", "path", "action"],
    "properties": {
        "seq": _COUNT, "path": _REL_PATH, "action": {"enum": ["write", "symlink", "delete", "chmod"]},
        "blob": _HASH_OR_NULL, "target": {"type": ["string", "null"]},
        "mode": {"anyOf": [_MODE, {"type": "null"}]}, "mtime_ns": _MTIME,
    },
    "allOf": [_when("action", "write", {"required": ["blob"], "properties": {"blob": _HASH}}),
              _when("action", "symlink", {"required": ["target"],
                                          "properties": {"target": {"type": "string", "minLength": 1}}})],
}
_CHANGE = {
    "type": "object",
    "required": ["path", "status", "type", "mode", "target", "blob"],
    "properties": {
        "path": _REL_PATH, "status": {"enum": ["added", "modified", "deleted"]},
        "type": {"enum": ["file", "dir", "symlink", "other", None]},
        "mode": {"type": ["integer", "null"]}, "target": {"type": ["string", "null"]}, "blob": _HASH_OR_NULL,
    },
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "ccw witness manifest",
    "description": "manifest.json of a ccw witness archive (mcp_server/fs/witness.py says the format).",
    "type": "object",
    "required": ["format", "workspace", "include_blobs", "base", "capsule", "execs", "changes"],
    "properties": {
        "format": {"const": FORMAT},
        # Where the replay shows the rebuilt base in the jail: an absolute, normal path.
        "workspace": {"type": "string", "maxLength": 4096,
                      "pattern": r"^/(?:(?!\.\.?(?:/|$))[^/\x00]+(?:/(?!\.\.?(?:/|$))[^/\x00]+)*)?$"},
        "include_blobs": {"type": "boolean"},
        "base": {
            "type": "object",
            "required": ["files"],
            "properties": {
                "read_sets_complete": {"type": "boolean"},
                "carried": {"enum": ["used", "all"]},
                "top": _BASE_TOP,  # absent in witnesses made before the top was recorded
                "files": {"type": "array", "items": _BASE_ENTRY},
            },
        },
        "capsule": {
            "type": "object",
            "required": ["env_whitelist", "limits"],
            "properties": {
                "clock": {"type": ["string", "null"]},
                "clock_offset_sec": {"type": ["integer", "null"], "minimum": -MAX_CLOCK_OFFSET_SEC,
                                     "maximum": MAX_CLOCK_OFFSET_SEC},
                "env_whitelist": _ENV_NAMES,
                "limits": {"type": "object"},  # each limit checked by sandbox.spec.Limits
                "network": {"anyOf": [{"const": "none"}, {"type": "object"}]},
                "volatile": GLOBS_SCHEMA,  # absent in witnesses made before volatile paths
                # Host dirs the capsule showed read-only (absent when none); a replay shows only
                # those its replayer's checks allow (capsules/exposure.py: replayable).
                "expose": {"type": "array", "items": {"type": "string", "pattern": "^/"}, "maxItems": MAX_BINDS},
                # Git dirs outside the workspace the capsule showed (a worktree's; absent when none).
                # A witness does not carry them: its replay runs git outside any repository.
                "gitdirs": {"type": "array", "items": {"type": "string", "pattern": "^/"}, "maxItems": MAX_BINDS},
            },
        },
        "execs": {"type": "array", "items": _EXEC},
        "writes": {"type": "array", "items": _WRITE},
        "changes": {"type": "array", "items": _CHANGE},
    },
}


def _is_int(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


_Validator = extend(Validator, type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_int))
_VALIDATOR = _Validator(SCHEMA)


def check(manifest: Any) -> None:
    """Raise INVALID_ARGUMENT naming the fields of ``manifest`` that break the schema."""
    errors = list(itertools.islice(_VALIDATOR.iter_errors(manifest), MAX_REPORTED))
    if errors:
        problems = [{"field": "/" + "/".join(str(p) for p in e.absolute_path), "msg": e.message[:300]} for e in errors]
        _refuse("; ".join(f"{p['field']}: {p['msg']}" for p in problems), problems)
    try:
        Limits.from_json(manifest["capsule"]["limits"], "capsule.limits")
    except CcwError as exc:
        _refuse(f"/capsule/limits: {exc.message}", [{"field": "/capsule/limits", "msg": exc.message}])
    for index, entry in enumerate(manifest["execs"]):
        _check_services(f"/execs/{index}/services", entry.get("services") or [])


def _check_services(where: str, services: list[dict[str, Any]]) -> None:
    """What the schema cannot say of the services beside one exec: each as the helper checks it."""
    names = [service["name"] for service in services]
    if len(set(names)) != len(names):
        _refuse(f"{where}: a name is given twice ({names})", [{"field": where, "msg": "names are not unique"}])
    for index, service in enumerate(services):
        field = f"{where}/{index}"
        try:
            argv(f"{field}/argv", service["argv"])
            if service.get("limits") is not None:
                Limits.from_json(service["limits"], f"{field}/limits")
        except CcwError as exc:
            _refuse(f"{field}: {exc.message}", [{"field": field, "msg": exc.message}])


def _refuse(what: str, problems: list[dict[str, str]]) -> None:
    raise CcwError(
        "INVALID_ARGUMENT",
        f"the witness's manifest.json does not match the {FORMAT} manifest schema ({what}); "
        "it was not made by ccw or was altered: make the witness again with capsule_witness",
        {"errors": problems},
    )
