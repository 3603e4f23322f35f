"""``ccw client-config``: the TOML snippet is built, not pasted together, and reads back; with
``--http`` each client's snippet carries the server's bearer token in its own syntax."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_server.capsules.run import WAIT_MS_DEFAULT, WAIT_MS_MAX
from mcp_server.cli import main
from mcp_server.cli.clients import CLIENTS, http_snippet, snippet, toml_key, toml_string
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


@pytest.mark.parametrize("make", [lambda: snippet("codex", "/usr/bin/ccw-mcp", {"CCW_STATE_DIR": "/s"}),
                                  lambda: http_snippet("codex", "http://127.0.0.1:9/mcp", "tok")])
def test_codex_waits_longer_than_the_longest_wait_ms(make: Any) -> None:
    # Codex cuts a tool call at tool_timeout_sec (60 s by default); a call asking for the
    # longest wait_ms must still get its "running" answer.
    text, value = make()
    timeout = tomllib.loads(text)["mcp_servers"]["ccw"]["tool_timeout_sec"]
    assert timeout == value["mcp_servers"]["ccw"]["tool_timeout_sec"] > WAIT_MS_MAX / 1000 > WAIT_MS_DEFAULT / 1000


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
    assert main(["--state-dir", str(tmp_path), "client-config", "codex", "--toolsets", "witness,agent"]) == 0
    codex = tomllib.loads(capsys.readouterr().out)
    assert codex["mcp_servers"]["ccw"]["env"]["CCW_TOOLSETS"] == "agent,witness"
    assert main(["--state-dir", str(tmp_path), "client-config", "claude", "--toolsets", "agnet"]) == 1
    assert "profiles: agent" in capsys.readouterr().err


def test_client_config_help_documents_the_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    from mcp_server.config import PROFILES

    with pytest.raises(SystemExit):
        main(["client-config", "--help"])
    shown = capsys.readouterr().out
    assert "profile agent:" in shown and all(name in shown for name in PROFILES["agent"])


def test_serve_maps_the_log_flags() -> None:
    from mcp_server.cli import parse_args, serve_env

    args = parse_args(["serve", "--log-level", "debug", "--log-format", "json"])
    assert serve_env(args) == {"CCW_LOG_LEVEL": "debug", "CCW_LOG_FORMAT": "json"}


def _http_config(capsys: pytest.CaptureFixture[str], state: Path, client: str, *extra: str) -> dict:
    assert main(["--state-dir", str(state), "client-config", client, "--http", "127.0.0.1:8765", "--json",
                 *extra]) == 0
    captured = capsys.readouterr()
    assert "bearer token" in captured.err  # the warning that the snippet holds a secret
    document: dict = json.loads(captured.out)
    assert document["transport"] == "http"
    return document


@pytest.mark.parametrize("client", CLIENTS)
def test_http_snippets_carry_the_generated_token(client: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    document = _http_config(capsys, state, client)
    made = state / "http-tokens.json"  # made here the way the server makes it: it had not started yet
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o600
    token = json.loads(made.read_text())["tokens"][0]["token"]
    key = {"codex": "mcp_servers", "vscode": "servers"}.get(client, "mcpServers")
    server = document["config"][key]["ccw"]
    assert server["url"] == "http://127.0.0.1:8765/mcp"
    headers = server["http_headers" if client == "codex" else "headers"]
    assert headers == {"Authorization": f"Bearer {token}"}
    assert "command" not in server and "env" not in server
    assert server.get("type") == {"claude": "http", "vscode": "http"}.get(client)
    parsed = tomllib.loads(document["text"]) if client == "codex" else json.loads(document["text"])
    assert parsed == document["config"]
    # The same token on a second run: a client's config stays valid.
    assert _http_config(capsys, state, client)["config"] == document["config"]


@pytest.mark.parametrize("client", CLIENTS)
def test_stdio_snippets_carry_no_token(client: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--state-dir", str(tmp_path / "state"), "client-config", client, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["transport"] == "stdio" and "Bearer" not in document["text"]
    assert not (tmp_path / "state" / "http-tokens.json").exists()


def test_http_snippet_with_a_tokens_file_names_the_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"name": "ci", "token": "ci-token-0123", "scopes": ["read"]},
                                             {"name": "ops", "token": "ops-token-0123", "scopes": ["admin"]}]}))
    tokens.chmod(0o600)
    monkeypatch.setenv("CCW_TOKENS_FILE", str(tokens))
    state = tmp_path / "state"
    document = _http_config(capsys, state, "cursor", "--token-name", "ci")
    assert document["config"]["mcpServers"]["ccw"]["headers"] == {"Authorization": "Bearer ci-token-0123"}
    assert not (state / "http-tokens.json").exists()  # a tokens file is set: nothing is generated
    assert main(["--state-dir", str(state), "client-config", "cursor", "--http", "127.0.0.1:8765"]) == 1
    assert "choose one with --token-name (ci, ops)" in capsys.readouterr().err


def test_http_snippet_refuses_toolsets_and_bad_addresses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = str(tmp_path / "state")
    assert main(["--state-dir", state, "client-config", "codex", "--http", "127.0.0.1:8765",
                 "--toolsets", "agent"]) == 1
    assert "pass --toolsets to ccw serve" in capsys.readouterr().err
    assert main(["--state-dir", state, "client-config", "codex", "--http", "localhost"]) == 1
    assert "use host:port" in capsys.readouterr().err


def test_codex_http_snippet_round_trips_through_tomllib() -> None:
    text, value = http_snippet("codex", "http://[::1]:9/mcp", 'tok"en\\')
    assert tomllib.loads(text) == value
