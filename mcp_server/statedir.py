"""Making the state dir: 0700, whichever path makes it first.

The helper's launcher, the front-end lock, the CLI's daemon start, ``State``, the tokens
file and ``ccw witness`` may each be the first to make the state dir, and each goes
through ``make_state_dir``.  ``Path.mkdir(parents=True, mode=...)`` gives the mode only to
the last directory it makes, and the parents get the umask's, so making ``<state>/helper``
first left the state dir 0755 and its journal (argv, outputs, what was typed into a
capsule) readable by every local user.  A state dir an older ccw left with group or
other read bits is this user's own: it is tightened, and the log says so.  One that
others may write is left alone: what it holds may be theirs already, and
``fs/privatefile.state_dir_fd`` refuses it where a private file is read.

A module of its own, below ``state``, ``launcher`` and ``auth``, which all use it
(pyproject.toml's layers).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mcp_server.logs import LOGGER
from sandbox.errors import wrap_oserror


def make_state_dir(state_dir: str | Path) -> None:
    """Make the state dir 0700 if absent (its parents as the umask says); tighten one of
    ours that group or others may enter or read, but not write, and say so (one they may
    write is left for ``state_dir_fd`` to refuse: what it holds may be theirs already)."""
    where = str(state_dir)
    with wrap_oserror("create state dir", where, "set CCW_STATE_DIR to a directory you own"):
        parent = os.path.dirname(os.path.abspath(where))
        os.makedirs(parent, exist_ok=True)
        try:
            os.mkdir(where, 0o700)
        except FileExistsError:
            info = os.stat(where)
        else:
            os.chmod(where, 0o700)  # the umask may have taken the owner's bits too
            return
        if not stat.S_ISDIR(info.st_mode) or not info.st_mode & 0o077:
            return
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return  # someone else may have planted files in it already: refused where it is opened (state_dir_fd)
        if info.st_uid != os.geteuid():
            LOGGER.warning(f"mcp:state-dir {where} has mode {stat.S_IMODE(info.st_mode):04o} and belongs to uid "
                           f"{info.st_uid}: other users may read its journal; make it private (chmod 700 {where})")
            return
        os.chmod(where, 0o700)
    LOGGER.warning(f"mcp:state-dir {where} had mode {stat.S_IMODE(info.st_mode):04o} (left so by an older ccw, or "
                   "made by hand): other users could read its journal and what was typed into capsules; made it 0700")
