"""core/witness_manifest: what ccw writes passes; every field a replay reads is typed and bounded."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from mcp_server.core.witness_manifest import SCHEMA, check
from sandbox.errors import CcwError
from tests.support import witness_craft as craft


def _manifest() -> dict[str, Any]:
    entry, _ = craft.exec_entry(1, ["sh", "-c", "ls"], stdout=b"a.txt\n")
    made = craft.manifest("/home/u/project", [entry], {"a.txt": b"a\n", "src/b.py": b"b\n"})
    made["base"]["files"] += [{"path": "src", "type": "dir", "mode": 0o755},
                              {"path": "link", "type": "symlink", "mode": 0o777, "target": "/usr/bin/python3"}]
    made["writes"] = [{"seq": 2, "path": "c.txt", "action": "write", "blob": craft.blob_hash(b"c"), "target": None,
                       "mode": 0o644, "mtime_ns": 5},
                      {"seq": 3, "path": "c.txt", "action": "delete", "blob": None, "target": None, "mode": None,
                       "mtime_ns": None}]
    made["base"]["top"] = {"mode": 0o755, "uid": 1000, "gid": 1000}
    made["capsule"]["limits"] = {"memory_mb": 512}
    return made


def test_the_schema_is_draft_2020_12_and_what_ccw_writes_passes() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    check(_manifest())


def _set(made: dict[str, Any], pointer: str, value: Any) -> dict[str, Any]:
    made = copy.deepcopy(made)
    *parents, last = pointer.strip("/").split("/")
    where: Any = made
    for part in parents:
        where = where[int(part)] if isinstance(where, list) else where[part]
    if value is KeyError:
        del where[last]
    elif isinstance(where, list):
        where[int(last)] = value
    else:
        where[last] = value
    return made


@pytest.mark.parametrize(("pointer", "value"), [
    ("/base/files/0/mode", 420.0),  # JSON Schema's integer takes 420.0; os.fchmod must not
    ("/base/files/0/mode", True),
    ("/base/files/0/mode", 0o10000),
    ("/base/files/0/mtime_ns", 1 << 63),
    ("/base/files/0/blob", KeyError),  # a file without its blob
    ("/base/files/3/target", KeyError),  # a symlink without its target
    ("/base/files/0/path", "../x"), ("/base/files/0/path", "/etc/passwd"), ("/base/files/0/path", "a//b"),
    ("/base/files/0/path", "a/./b"), ("/base/files/0/path", ""),
    ("/base/top/mode", 0o10000), ("/base/top/mode", 493.0), ("/base/top/uid", -1), ("/base/top/gid", (1 << 32) - 1),
    ("/base/top/uid", KeyError), ("/base/top", "root"),
    ("/writes/0/blob", None),  # a write without its bytes
    ("/writes/0/action", "exec"),
    ("/execs/0/argv", []), ("/execs/0/argv", ["sh", 1]), ("/execs/0/touched", {"read": []}),
    ("/execs/0/output", {"stdin": {"blob": craft.blob_hash(b""), "kept_bytes": 0, "cap": 1}}),
    ("/execs/0/written_mtimes", {"../x": 1}), ("/execs/0/timeout_ms", 0),
    ("/execs/0/touched/network", [{"host": "h", "port": "80", "protocol": "http", "allowed": True}]),
    ("/capsule/env_whitelist", ["A-B"]), ("/capsule/clock_offset_sec", 10 ** 12), ("/capsule/network", ["x"]),
    ("/capsule/env_whitelist", ["A\n"]), ("/writes/0/blob", craft.blob_hash(b"c") + "\n"),  # $ ends the string
    ("/capsule/limits", {"memory_mb": 0}), ("/capsule/limits", {"swap_mb": 1}),
    ("/workspace", "ws"), ("/workspace", "/a/../b"), ("/workspace", "/a/"), ("/format", "ccw-witness/2"),
    ("/include_blobs", 1), ("/changes", KeyError),
])
def test_a_bad_field_is_invalid_argument_naming_it(pointer: str, value: Any) -> None:
    with pytest.raises(CcwError) as refused:
        check(_set(_manifest(), pointer, value))
    assert refused.value.code == "INVALID_ARGUMENT"
    fields = [error["field"] for error in refused.value.details["errors"]]
    assert any(pointer.startswith(field) or field.startswith(pointer.rsplit("/", 1)[0]) for field in fields), fields


def test_older_witnesses_without_the_later_fields_still_pass() -> None:
    made = _manifest()
    del made["writes"]
    for ex in made["execs"]:
        for later in ("output", "written_mtimes", "timeout_ms", "stdin_blob", "env_keys"):
            del ex[later]
    for entry in made["base"]["files"]:
        entry.pop("mtime_ns", None)
    del made["base"]["carried"], made["base"]["top"], made["capsule"]["network"]
    check(made)


def test_a_hostile_manifest_is_named_in_a_few_errors_not_millions() -> None:
    made = _manifest()
    made["base"]["files"] = [{"path": "../x", "type": "file", "mode": -1}] * 100_000
    with pytest.raises(CcwError) as refused:
        check(made)
    assert len(refused.value.details["errors"]) <= 5 and len(refused.value.message) < 3000


# --- services beside an exec (issue 36) ------------------------------------------------

_WEB = {"name": "web", "argv": ["python3", "server.py"], "cwd": "/home/u/project", "restart": "no",
        "env": ["PORT"], "ready": {"port": 8765, "timeout_ms": 20000}, "limits": {"memory_mb": 256}}


def _with_services() -> dict[str, Any]:
    """An exec beside the service ``web``, then the service's own run (no time limit)."""
    made = _manifest()
    made["execs"][0]["services"] = [copy.deepcopy(_WEB), {
        "name": "db", "argv": ["redis-server"], "cwd": None, "restart": "always",
        "ready": {"line": "Ready to accept", "timeout_ms": 30000}}]
    run, _ = craft.exec_entry(2, ["python3", "server.py"])
    made["execs"].append({**run, "service": "web", "timeout_ms": 0})
    return made


def test_an_exec_beside_services_and_a_services_own_run_pass() -> None:
    check(_with_services())


@pytest.mark.parametrize(("pointer", "value"), [
    ("/execs/0/services", [_WEB] * 17),  # more than MAX_SERVICES
    ("/execs/0/services", {"web": _WEB}),
    ("/execs/0/services/0/name", "Web!"), ("/execs/0/services/0/name", "a" * 64),
    ("/execs/0/services/0/name", KeyError),
    ("/execs/0/services/0/argv", []), ("/execs/0/services/0/argv", ["sh", 1]), ("/execs/0/services/0/argv", KeyError),
    ("/execs/0/services/0/argv", [""]),  # no program name (sandbox.checks.argv)
    ("/execs/0/services/0/argv", ["sh", "x" * (2 * 1024 * 1024)]),  # past MAX_ARG_BYTES
    ("/execs/0/services/0/argv", ["x"] * 4097),  # past MAX_ARGV
    ("/execs/0/services/0/cwd", "relative/dir"), ("/execs/0/services/0/cwd", "/a\x00b"),
    ("/execs/0/services/0/env", ["A-B"]), ("/execs/0/services/0/env", {"PORT": "8765"}),  # names, never values
    ("/execs/0/services/0/limits", {"memory_mb": 0}), ("/execs/0/services/0/limits", {"swap_mb": 1}),
    ("/execs/0/services/0/restart", "sometimes"),
    ("/execs/0/services/0/ready", {"timeout_ms": 100}),  # no condition
    ("/execs/0/services/0/ready", {"port": 8765, "path": "/tmp/up"}),  # two
    ("/execs/0/services/0/ready/port", 0), ("/execs/0/services/0/ready/port", 65536),
    ("/execs/0/services/0/ready/timeout_ms", 600_001), ("/execs/0/services/0/ready/timeout_ms", 0),
    ("/execs/0/services/1/ready/line", "a" * 513),
    ("/execs/0/services/1/name", "web"),  # two services of one name beside one exec
    ("/execs/1/service", "Web!"),
    ("/execs/0/timeout_ms", 0),  # only a service's run has no time limit
])
def test_hostile_services_are_refused_naming_the_field(pointer: str, value: Any) -> None:
    with pytest.raises(CcwError) as refused:
        check(_set(_with_services(), pointer, value))
    assert refused.value.code == "INVALID_ARGUMENT"
    fields = [error["field"] for error in refused.value.details["errors"]]
    assert any(pointer.startswith(field) or field.startswith(pointer.rsplit("/", 1)[0]) for field in fields), fields


def test_the_bounds_of_a_service_are_the_spec_s_own() -> None:
    from mcp_server.capsules import service_spec
    from mcp_server.core import witness_manifest
    from sandbox.checks import SERVICE_NAME_RE

    assert SERVICE_NAME_RE.pattern == witness_manifest.SERVICE_NAME_PATTERN
    assert witness_manifest.SERVICE_RESTARTS == service_spec.RESTARTS
    assert witness_manifest.SERVICE_READY_LINE_MAX == service_spec.LINE_MAX
    assert witness_manifest.SERVICE_READY_TIMEOUT_MAX_MS == service_spec.READY_TIMEOUT_MAX_MS
    # What the schema lets through, the spec takes whole, but the variables' names: a replay
    # gives its services the replayer's values instead.
    for form in _with_services()["execs"][0]["services"]:
        spec = service_spec.ServiceSpec.from_json("cap_1", form)
        assert spec.env is None
        assert spec.for_witness() == {key: value for key, value in form.items() if key != "env"}
