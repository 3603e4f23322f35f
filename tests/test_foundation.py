"""Canonical JSON, the error type and the configuration."""

from __future__ import annotations

import errno
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_server.config import Config
from mcp_server.core.canonical import canonical_json
from sandbox.errors import CcwError, from_oserror, wrap_oserror

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def test_canonical_json_sorts_keys_and_is_compact() -> None:
    assert canonical_json({"b": 1, "a": [2, {"d": None, "c": "é"}]}) == (
        '{"a":[2,{"c":"é","d":null}],"b":1}'.encode()
    )


def test_canonical_json_escapes_only_what_json_requires() -> None:
    assert canonical_json("a/b\"\n\x01") == b'"a/b\\"\\n\\u0001"'


def test_canonical_json_refuses_nan() -> None:
    with pytest.raises(ValueError):
        canonical_json(float("nan"))


@given(json_values)
def test_canonical_json_round_trips_and_is_stable(value: object) -> None:
    encoded = canonical_json(value)
    assert canonical_json(json.loads(encoded)) == encoded
    assert not encoded.endswith(b"\n")


def test_oserror_becomes_a_coded_error_naming_path_and_errno() -> None:
    err = from_oserror(OSError(errno.EACCES, "denied"), "open", "/x", "run as root")
    assert err.code == "PERMISSION_DENIED"
    assert "open '/x' failed: EACCES" in err.message and "run as root" in err.message
    assert err.details == {"errno": "EACCES", "path": "/x"}
    with pytest.raises(CcwError) as info, wrap_oserror("stat", "/nope"):
        raise FileNotFoundError(errno.ENOENT, "gone")
    assert info.value.code == "NOT_FOUND"


def test_error_round_trips_through_its_wire_form() -> None:
    err = CcwError("STALE_LEASE", "re-read", {"fingerprint": {"head_oid": ""}})
    again = CcwError.from_dict(err.to_dict())
    assert again.to_dict() == err.to_dict()
    assert CcwError.from_dict({"code": "BOGUS", "message": "m"}).code == "INTERNAL"


def test_config_reads_env_with_seed_aliases(tmp_path: object) -> None:
    config = Config.from_env(
        {
            "MCP_ENDPOINT": "socket",
            "MCP_SOCKET_MODE": "0660",
            "SYN_SCHEMAS_DIR": "/schemas",
            "CCW_TOOLSETS": "text,capsule",
            "CCW_STATE_DIR": "/s",
        }
    )
    assert config.endpoint == "socket" and config.socket_mode == 0o660
    assert config.schemas_dir == "/schemas" and config.toolsets == ("capsule", "text")
    assert Config.from_env({"XDG_STATE_HOME": "/x"}).state_dir == "/x/ccw"


@pytest.mark.parametrize(
    "env", [{"MCP_ENDPOINT": "pigeon"}, {"MCP_SOCKET_MODE": "rw"}, {"CCW_TOOLSETS": "nope"}]
)
def test_config_rejects_bad_values_with_a_fix(env: dict[str, str]) -> None:
    with pytest.raises(CcwError) as info:
        Config.from_env(env)
    assert info.value.code == "INVALID_ARGUMENT"
