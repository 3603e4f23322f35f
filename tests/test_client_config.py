"""``ccw client-config codex``: the TOML snippet is built, not pasted together, and reads back."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_server.cli.clients import snippet, toml_key, toml_string
from sandbox.errors import CcwError

AWKWARD_PATHS = [
    "/home/u/del\x7fdir/state",  # U+007F: TOML forbids it raw; json.dumps leaves it raw
    '/srv/"quoted" dir/state',
    "/srv/back\\slash/state",
    "/srv/new\nline/tab\there",
    "/srv/bell\x07 and nul-adjacent \x1f",
    "/srv/'''triple'''/\"\"\"too\"\"\"",
    "/srv/# not a comment = [x]/{y}",
    "/srv/ünïcödé/日本語/🙂",
    "/srv/trailing\\",
]


@pytest.mark.parametrize("path", AWKWARD_PATHS)
def test_codex_snippet_round_trips_through_tomllib(path: str) -> None:
    env = {"CCW_STATE_DIR": path, "CCW_HELPER_SOCKET": "/run/ccw/helper.sock"}
    text, value = snippet("codex", f"{path}/bin/ccw-mcp", env)
    assert tomllib.loads(text) == value
    assert value["mcp_servers"]["ccw"]["env"]["CCW_STATE_DIR"] == path


@given(st.text(st.characters(exclude_categories=["Cs"]), max_size=40))
def test_any_utf8_string_round_trips(value: str) -> None:
    assert tomllib.loads(f"v = {toml_string(value)}\n{toml_key(value)} = 1\n") == {"v": value, value: 1}


def test_a_path_that_is_not_utf8_is_refused_with_a_reason() -> None:
    undecodable = b"/srv/\xff/state".decode("utf-8", "surrogateescape")
    with pytest.raises(CcwError, match="not valid UTF-8, which a TOML file cannot hold"):
        snippet("codex", "/usr/bin/ccw-mcp", {"CCW_STATE_DIR": undecodable})
