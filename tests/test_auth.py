"""mcp_server.auth: the generated local token (made once, private, never through a link) and
how an ``Authorization`` header is matched."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from mcp_server.auth import GENERATED_FILE, TokenTable
from sandbox.errors import CcwError


def test_generated_once_private_whatever_the_umask(tmp_path: Path) -> None:
    state = tmp_path / "new" / "state"
    old = os.umask(0)  # a careless umask must not widen the file
    try:
        first = TokenTable.generated(str(state))
    finally:
        os.umask(old)
    made = state / GENERATED_FILE
    info = os.lstat(made)
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert os.listdir(state) == [GENERATED_FILE]  # no temporary file left behind
    (entry,) = json.loads(made.read_text())["tokens"]
    assert entry["name"] == "local" and entry["scopes"] == ["admin"] and len(entry["token"]) >= 43
    assert TokenTable.generated(str(state)) == first  # the same token on the next start
    assert first.token_named(None) == entry["token"] and first.source == str(made)


def test_servers_starting_together_agree_on_one_token(tmp_path: Path) -> None:
    tables: list[TokenTable] = []
    threads = [threading.Thread(target=lambda: tables.append(TokenTable.generated(str(tmp_path)))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(tables) == 8 and len({table.token_named(None) for table in tables}) == 1
    assert os.listdir(tmp_path) == [GENERATED_FILE]


@pytest.mark.parametrize("plant", ["symlink", "dangling", "mode 0640", "mode 0606", "directory", "fifo"])
def test_anything_but_a_private_file_is_refused(tmp_path: Path, plant: str) -> None:
    spot = tmp_path / GENERATED_FILE
    elsewhere = tmp_path / "elsewhere.json"
    if plant in ("symlink", "dangling"):
        if plant == "symlink":
            elsewhere.write_text(json.dumps({"tokens": [{"token": "chosen", "scopes": ["admin"]}]}))
            elsewhere.chmod(0o600)
        spot.symlink_to(elsewhere)
    elif plant.startswith("mode"):
        spot.write_text(json.dumps({"tokens": [{"token": "seen", "scopes": ["admin"]}]}))
        spot.chmod(int(plant.split()[1], 8))
    elif plant == "directory":
        spot.mkdir()
    else:
        os.mkfifo(spot, 0o600)
    with pytest.raises(CcwError) as refused:
        TokenTable.generated(str(tmp_path))
    assert refused.value.code == "PERMISSION_DENIED"
    assert f"remove {spot}" in refused.value.message
    assert plant != "dangling" or not elsewhere.exists()  # nothing was written through the link


def test_authorization_must_be_bearer_and_the_exact_token() -> None:
    table = TokenTable.parse({"tokens": [{"name": "a", "token": "Tok-en_1", "scopes": ["read"]}]})
    accepted = table.authenticate("Bearer Tok-en_1")
    assert accepted is not None and accepted.name == "a"
    assert table.authenticate("bearer   Tok-en_1") == accepted  # the scheme in any case, then 1*SP (RFC 6750)
    for refused in (None, "", "Bearer", "Bearer ", "Tok-en_1", "Bearer tok-en_1", "Bearer Tok-en_", "Bearer Tok-en_1x",
                    "Bearer Tok -en_1", "Bearer Tok-en_1 x", "Bearer\tTok-en_1", "Basic Tok-en_1", "Bearer a"):
        assert table.authenticate(refused) is None, refused


def test_token_named_says_which_names_exist() -> None:
    table = TokenTable.parse({"tokens": [{"name": "a", "token": "1", "scopes": []},
                                         {"name": "b", "token": "2", "scopes": []}]}, "t.json")
    assert table.token_named("b") == "2"
    with pytest.raises(CcwError, match=r"t.json: 2 tokens; choose one with --token-name \(a, b\)"):
        table.token_named(None)
    with pytest.raises(CcwError, match="no token named 'c'"):
        table.token_named("c")
