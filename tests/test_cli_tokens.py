"""``ccw http token rotate`` (mcp_server/cli/tokens.py): it replaces the generated token without
printing it and says what to run next; it refuses an operator's CCW_TOKENS_FILE, leaving it
as it was; and it says when what it replaced was not a private file of the user's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mcp_server.auth import GENERATED_FILE, TokenTable
from mcp_server.cli import main
from mcp_server.cli.tokens import NEXT


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CCW_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("CCW_TOKENS_FILE", raising=False)
    return tmp_path / "state"


def test_rotate_replaces_the_token_and_says_what_next(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = TokenTable.generated(str(state)).token_named(None)
    assert main(["http", "token", "rotate"]) == 0
    out = capsys.readouterr().out
    new = TokenTable.generated(str(state)).token_named(None)
    assert new != old
    assert old not in out and new not in out  # a secret on a terminal is one more copy of it
    assert f"a new bearer token is in {state / GENERATED_FILE} (mode 0600), in place of the old one" in out
    assert "ends the sessions opened with it" in out and NEXT in out
    assert main(["http", "token", "rotate", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document == {"path": str(state / GENERATED_FILE), "replaced": True, "unsafe": "", "next": NEXT}
    assert TokenTable.generated(str(state)).token_named(None) not in (old, new)


def test_rotate_before_any_server_makes_the_first_token(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["http", "token", "rotate"]) == 0
    out = capsys.readouterr().out
    assert "in place of" not in out and NEXT in out
    assert TokenTable.generated(str(state)).token_named(None)


def test_rotate_says_what_it_replaced_when_it_was_not_private(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state.mkdir(mode=0o700)
    planted = state / GENERATED_FILE
    planted.write_text(json.dumps({"tokens": [{"name": "local", "token": "seen-by-others", "scopes": ["admin"]}]}))
    planted.chmod(0o644)
    assert main(["http", "token", "rotate"]) == 0
    out = capsys.readouterr().out
    assert "what it replaced was a regular file" in out and "mode 0644" in out and f"write {state}" in out
    assert TokenTable.generated(str(state)).token_named(None) != "seen-by-others"


def test_rotate_refuses_an_operators_tokens_file(state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = tmp_path / "tokens.json"
    text = json.dumps({"tokens": [{"name": "ci", "token": "ci-token-0123", "scopes": ["exec"]}]})
    tokens.write_text(text)
    before = os.stat(tokens)
    monkeypatch.setenv("CCW_TOKENS_FILE", str(tokens))
    assert main(["http", "token", "rotate"]) == 1
    err = capsys.readouterr().err
    assert f"CCW_TOKENS_FILE={tokens}" in err and "Edit that file instead" in err and "ends their sessions" in err
    after = os.stat(tokens)
    assert tokens.read_text() == text and (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert not (state / GENERATED_FILE).exists()
