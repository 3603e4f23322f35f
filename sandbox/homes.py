"""The login users' homes, as the rule on capsule and exposed directories sees them.

A home is what ``sandbox.hostdirs``' rule protects: never a capsule directory itself, never
shown with its key stores.  The login users are root and uids UID_MIN..UID_MAX of
/etc/login.defs (1000..60000 by default), read through NSS (``pwd.getpwall``), each home
resolved.  The helper asks at every create and at every exec of a capsule with exposed
directories, so the answer is kept until one of its sources changes.
"""

from __future__ import annotations

import functools
import os
import pwd
from dataclasses import dataclass


@dataclass(frozen=True)
class Home:
    """A login user's home directory (resolved), as the rule on capsule directories sees it."""

    user: str
    uid: int
    path: str


# What login_homes reads: a change to any of them (useradd renames a new /etc/passwd into
# place) gives a new stamp, so the answer is read again.  Users from other NSS sources
# (systemd's dynamic and homed users) have uids outside the login range by design.
_HOME_SOURCES = ("/etc/passwd", "/etc/nsswitch.conf")


def _stamp(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def login_homes(login_defs: str = "/etc/login.defs") -> tuple[Home, ...]:
    """The homes of root and of uids UID_MIN..UID_MAX (login.defs; 1000..60000 by default).

    Read again only when login.defs, /etc/passwd or nsswitch.conf changed: the helper asks
    at every exec of a capsule with exposed dirs, and reading costs about 0.4 ms.
    """
    return _login_homes(login_defs, tuple(_stamp(path) for path in (login_defs, *_HOME_SOURCES)))


@functools.lru_cache(maxsize=8)
def _login_homes(login_defs: str, stamps: tuple[tuple[int, ...] | None, ...]) -> tuple[Home, ...]:
    bounds = {"UID_MIN": 1000, "UID_MAX": 60000}
    try:
        with open(login_defs, encoding="utf-8", errors="replace") as defs:
            for line in defs:
                words = line.split()
                if len(words) == 2 and words[0] in bounds and words[1].isdigit():
                    bounds[words[0]] = int(words[1])
    except OSError:
        pass
    homes = []
    for entry in pwd.getpwall():
        if ((entry.pw_uid == 0 or bounds["UID_MIN"] <= entry.pw_uid <= bounds["UID_MAX"])
                and entry.pw_dir.startswith("/")):
            path = os.path.realpath(entry.pw_dir)
            if path != "/":
                homes.append(Home(entry.pw_name, entry.pw_uid, path))
    return tuple(homes)
