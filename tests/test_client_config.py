"""``ccw client-config codex``: the TOML snippet is built, not pasted together, and reads back."""

from __future__ import annotations

import tomllib
from pathlib import Path

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
    # Value and key in documents of their own: a generated key "v" must not collide.
    assert tomllib.loads(f"v = {toml_string(value)}\n") == {"v": value}
    assert tomllib.loads(f"{toml_key(value)} = 1\n") == {value: 1}


def test_a_path_that_is_not_utf8_is_refused_with_a_reason() -> None:
    undecodable = b"/srv/\xff/state".decode("utf-8", "surrogateescape")
    with pytest.raises(CcwError, match="not valid UTF-8, which a TOML file cannot hold"):
        snippet("codex", "/usr/bin/ccw-mcp", {"CCW_STATE_DIR": undecodable})


def test_toolsets_go_into_the_snippet_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mcp_server.cli import main

    assert main(["--state-dir", str(tmp_path), "client-config", "codex", "--toolsets", "witness,agent"]) == 0
    codex = tomllib.loads(capsys.readouterr().out)
    assert codex["mcp_servers"]["ccw"]["env"]["CCW_TOOLSETS"] == "agent,witness"
    assert main(["--state-dir", str(tmp_path), "client-config", "claude", "--toolsets", "agnet"]) == 1
    assert "profiles: agent" in capsys.readouterr().err


def test_client_config_help_documents_the_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    from mcp_server.cli import main
    from mcp_server.config import PROFILES

    with pytest.raises(SystemExit):
        main(["client-config", "--help"])
    shown = capsys.readouterr().out
    assert "profile agent:" in shown and all(name in shown for name in PROFILES["agent"])


def test_serve_maps_the_log_flags() -> None:
    from mcp_server.cli import parse_args, serve_env

    args = parse_args(["serve", "--log-level", "debug", "--log-format", "json"])
    assert serve_env(args) == {"CCW_LOG_LEVEL": "debug", "CCW_LOG_FORMAT": "json"}
