"""sandbox/homes.py: the login users' homes the rule on capsule directories protects (no root needed).

Which users count is login.defs' UID_MIN..UID_MAX, and root; each home is resolved and
/ is never one.  The answer is kept until login.defs, /etc/passwd or nsswitch.conf
changes, so the tests point ``login_homes`` at a login.defs of their own and change it.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from sandbox import homes


def _uids(found: tuple[homes.Home, ...]) -> set[int]:
    return {home.uid for home in found}


def test_root_and_the_login_range_count_and_no_one_else(tmp_path: Path) -> None:
    defs = tmp_path / "login.defs"
    defs.write_text("# a comment\nUID_MIN 1\nUID_MAX 99\nUID_MAX nonsense\nUID_MIN 5 6\n")
    found = homes.login_homes(str(defs))
    entries = {entry.pw_uid: entry for entry in pwd.getpwall()}
    assert 0 in _uids(found)  # root's home always counts
    for home in found:
        assert home.uid == 0 or 1 <= home.uid <= 99
        assert home.path == os.path.realpath(entries[home.uid].pw_dir) and home.path != "/"
        assert home.user == entries[home.uid].pw_name
    # Everyone in the range with a home that is not / is there.
    wanted = {uid for uid, entry in entries.items() if (uid == 0 or 1 <= uid <= 99)
              and entry.pw_dir.startswith("/") and os.path.realpath(entry.pw_dir) != "/"}
    assert _uids(found) == wanted


def test_without_login_defs_the_range_is_1000_to_60000(tmp_path: Path) -> None:
    found = homes.login_homes(str(tmp_path / "absent"))
    assert all(home.uid == 0 or 1000 <= home.uid <= 60000 for home in found)
    assert 0 in _uids(found)


def test_the_answer_is_kept_until_a_source_changes(tmp_path: Path) -> None:
    defs = tmp_path / "login.defs"
    defs.write_text("UID_MIN 1\nUID_MAX 99\n")
    first = homes.login_homes(str(defs))
    assert homes.login_homes(str(defs)) is first  # not read again
    defs.write_text("UID_MIN 60001\nUID_MAX 60002\n")  # as an editor would: new size and times
    narrower = homes.login_homes(str(defs))
    assert narrower is not first
    assert all(home.uid == 0 or 60001 <= home.uid <= 60002 for home in narrower)
