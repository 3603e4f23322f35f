"""mcp_server.auth: the generated local token (made once, private, never through a link; rotated
by a rename), how an ``Authorization`` header is matched, and how a running server's view of
its tokens file notices a change and names the credentials it revoked."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from mcp_server import auth
from mcp_server.auth import (
    GENERATED_FILE,
    Rotation,
    TokenFile,
    TokenTable,
    credential_key,
    rotate_generated,
)
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


def _entry(table: TokenTable) -> tuple[str, str]:
    ((token, principal),) = table.entries
    return token.decode(), principal.key


def test_rotate_replaces_the_token_privately_in_one_rename(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = TokenTable.generated(str(state))
    before = os.lstat(state / GENERATED_FILE)
    old = os.umask(0)
    try:
        rotation = rotate_generated(str(state))
    finally:
        os.umask(old)
    assert rotation == Rotation(str(state / GENERATED_FILE), replaced=True, unsafe="")
    after = os.lstat(state / GENERATED_FILE)
    assert stat.S_IMODE(after.st_mode) == 0o600 and after.st_uid == os.geteuid()
    assert after.st_ino != before.st_ino  # a new file renamed in, which a server's stat sees
    assert os.listdir(state) == [GENERATED_FILE]  # no temporary file left behind
    second = TokenTable.generated(str(state))
    (entry,) = json.loads((state / GENERATED_FILE).read_text())["tokens"]
    assert entry["name"] == "local" and entry["scopes"] == ["admin"] and len(entry["token"]) >= 43
    assert second.token_named(None) == entry["token"] != first.token_named(None)
    assert first.authenticate(f"Bearer {entry['token']}") is None
    assert second.authenticate(f"Bearer {first.token_named(None)}") is None


def test_rotate_makes_the_first_token_too(tmp_path: Path) -> None:
    rotation = rotate_generated(str(tmp_path / "new"))
    assert not rotation.replaced and rotation.unsafe == ""
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o700
    assert TokenTable.generated(str(tmp_path / "new")).token_named(None)


@pytest.mark.parametrize("plant", ["symlink", "mode 0644", "fifo"])
def test_rotate_replaces_what_was_planted_without_following_it(tmp_path: Path, plant: str) -> None:
    spot = tmp_path / GENERATED_FILE
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("untouched")
    if plant == "symlink":
        spot.symlink_to(elsewhere)
    elif plant == "fifo":
        os.mkfifo(spot, 0o600)
    else:
        spot.write_text(json.dumps({"tokens": [{"token": "seen", "scopes": ["admin"]}]}))
        spot.chmod(0o644)
    rotation = rotate_generated(str(tmp_path))
    assert rotation.replaced and rotation.unsafe  # said, so the user can look at who writes there
    assert elsewhere.read_text() == "untouched"
    info = os.lstat(spot)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert TokenTable.generated(str(tmp_path)).token_named(None) != "seen"


def test_rotate_refuses_a_directory_in_the_way(tmp_path: Path) -> None:
    (tmp_path / GENERATED_FILE).mkdir()
    with pytest.raises(CcwError, match="replace generated tokens file"):
        rotate_generated(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [GENERATED_FILE]  # the temporary file is gone


def test_a_credential_is_the_token_under_its_name() -> None:
    one = TokenTable.parse({"tokens": [{"name": "a", "token": "t-1", "scopes": ["read"]},
                                       {"name": "b", "token": "t-1", "scopes": ["read"]}]})
    again = TokenTable.parse({"tokens": [{"name": "a", "token": "t-1", "scopes": ["admin"]}]})
    (_, a), (_, b) = one.entries
    assert a.key == again.entries[0][1].key  # scopes are not the credential: a scope change ends nothing
    assert a.key != b.key  # the same token under another name is another credential
    assert len(a.key) == 32 and "t-1" not in a.key and a.key != credential_key("a", b"t-2")


def test_the_generated_file_is_looked_at_and_a_rotation_revokes(tmp_path: Path) -> None:
    watched = TokenFile.for_server("", str(tmp_path))
    try:
        old_token, old_key = _entry(watched.table)
        assert watched.generated and watched.refresh() == frozenset() and not watched.fault
        rotate_generated(str(tmp_path))
        assert watched.refresh() == {old_key}
        new_token, new_key = _entry(watched.table)
        assert new_token != old_token and new_key != old_key
        assert watched.table.authenticate(f"Bearer {old_token}") is None
        assert watched.refresh() == frozenset()  # revoked once
    finally:
        watched.close()


def test_an_unusable_file_revokes_nothing_and_is_a_fault_until_fixed(tmp_path: Path) -> None:
    watched = TokenFile.for_server("", str(tmp_path))
    spot = tmp_path / GENERATED_FILE
    good = spot.read_text()
    try:
        token, _ = _entry(watched.table)
        for spoil, said in ((lambda: spot.write_text("{half saved"), "not JSON"),
                            (lambda: spot.chmod(0o644), "mode 0600"),
                            (spot.unlink, "ccw http token rotate")):
            spoil()
            assert watched.refresh() == frozenset()
            assert said in watched.fault
            assert _entry(watched.table)[0] == token  # the last good table, for what a fix revokes
            spot.write_text(good)
            spot.chmod(0o600)
            assert watched.refresh() == frozenset() and watched.fault == ""
        spot.write_text("{half saved")
        watched.refresh()
        rotate_generated(str(tmp_path))  # the fix: the token that was good before the fault is revoked
        assert len(watched.refresh()) == 1 and watched.fault == ""
    finally:
        watched.close()


def test_an_operators_file_edited_in_place_within_one_clock_tick_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tokens.json"
    entries = [{"name": "ci", "token": "ci-token-1", "scopes": ["exec"]},
               {"name": "ops", "token": "ops-token-1", "scopes": ["admin"]}]
    path.write_text(json.dumps({"tokens": entries}))
    frozen = os.stat(path)  # an edit in the same tick leaves the stat as it was: what a look sees
    monkeypatch.setattr(auth, "_stat", lambda name, dir_fd: frozen)
    watched = TokenFile.for_server(str(path), str(tmp_path / "state"))
    assert not watched.generated and len(watched.table.entries) == 2
    path.write_text(json.dumps({"tokens": [entries[1]]}))  # ci removed, in place
    (revoked,) = watched.refresh()
    assert revoked == credential_key("ci", b"ci-token-1")
    assert watched.table.authenticate("Bearer ci-token-1") is None
    assert watched.table.authenticate("Bearer ops-token-1") is not None
    monkeypatch.setattr(auth, "RACY_NS", 0)  # once the file has been still long enough: one stat a look
    watched.refresh()
    path.write_text(json.dumps({"tokens": []}))
    assert watched.refresh() == frozenset() and len(watched.table.entries) == 1


def test_an_operators_file_must_be_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "tokens.fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(CcwError, match="not a regular file"):
        TokenFile.for_server(str(fifo), str(tmp_path))  # and the open did not hang on the FIFO


def test_a_shared_operators_file_is_warned_about_once_a_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [{"name": "ci", "token": "ci-token-1", "scopes": ["exec"]}]}))
    path.chmod(0o644)  # shared on purpose, perhaps: accepted, and said
    warned: list[str] = []
    monkeypatch.setattr(auth.LOGGER, "warning", warned.append)
    watched = TokenFile.for_server(str(path), str(tmp_path / "state"))
    for _ in range(3):  # changed just now: each look reads it again, and says nothing new
        assert watched.refresh() == frozenset()
    assert len(warned) == 1 and "readable by group or others" in warned[0]


def test_a_deeply_nested_file_is_a_fault_not_a_crash(tmp_path: Path) -> None:
    watched = TokenFile.for_server("", str(tmp_path / "state"))
    try:
        (tmp_path / "state" / GENERATED_FILE).write_text("[" * 200_000)
        assert watched.refresh() == frozenset() and "not JSON" in watched.fault
    finally:
        watched.close()
