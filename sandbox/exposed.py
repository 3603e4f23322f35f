"""Host directories a capsule shows read-only besides its workspace (issue 25: toolchains).

The front end finds what a workspace needs (mcp_server/capsules/exposure.py) and puts
the directories in ``CapsuleSpec.expose``; the spec is the caller's word, so the helper
holds every path to the same rule again, as it does the workspace (sandbox/access.py):

* at create, each path is opened (O_PATH, pinned), and the path itself and the directory
  under every path it has (resolved, and other mounts of it) must pass
  ``hostdirs.check_expose_dir`` against the caller's host uid and the login homes, and be
  readable and searchable by the caller (``access.check_shown_dir``: a root helper must not
  show a user what the user could not read); for a root caller, its filesystem must take
  an idmapped mount (sandbox/idmap.py: how its jail is shown host trees), else
  UNSUPPORTED.  The paths (normalised, not resolved: a link to a toolchain is shown at
  the link's path) go in the spec kept in meta.json; forks inherit them.
* at every exec the same checks run again, since the host may have changed (a toolchain
  removed, a directory replaced by a symlink to a key store): a refused one refuses the
  exec (PERMISSION_DENIED), a missing one is left out (the command then fails as it
  would on the host, and the front end's hint says what is missing).  Each passes to the
  jail as a read-only ``mounts.Bind`` at the path it was recorded at.

A directory inside the workspace is refused: the workspace is shown already, and a
read-only bind over part of it would hide what the capsule writes there.  One that holds
the workspace is bound first (binds go by depth), so the workspace shows over it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from sandbox import access, homes, hostdirs, idmap, mountinfo, mounts
from sandbox.errors import CcwError, from_oserror
from sandbox.homes import Home
from sandbox.hostdirs import inside
from sandbox.meta import Capsule
from sandbox.mountinfo import Mount


def _read() -> tuple[tuple[Home, ...], Sequence[Mount]]:
    """The login homes and our mount table, read once for all of a capsule's dirs."""
    return homes.login_homes(), mountinfo.table()


def _checked(path: str, workspace: str, uid: int, gid: int, read: tuple[tuple[Home, ...], Sequence[Mount]],
             at_create: bool = False) -> str | None:
    """``path`` resolved once the caller may see it through a capsule; None when it is gone.

    ``at_create``: also refuse a directory a root caller's jail could not be shown idmapped (idmap.py).
    """
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise from_oserror(exc, "open expose", path, "expose existing directories only") from exc
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
        real_workspace = os.path.realpath(workspace)
        if any(inside(where, real_workspace) or inside(where, workspace) for where in (real, path)):
            raise CcwError("INVALID_ARGUMENT", f"expose {path!r} (the directory {real}) lies in the workspace "
                           f"{workspace!r}, which the jail shows already; expose directories outside it",
                           {"argument": "expose", "path": real})
        # The path itself is where the jail shows the directory: held to the rule too.
        hostdirs.check_expose_dir("expose", path, access.host_uid(uid), read[0])
        access.check_shown_dir("expose", fd, path, uid, gid, read)
        if at_create and idmap.for_caller(uid) is not None:
            idmap.check_exposed(fd, path)
        return real
    finally:
        os.close(fd)


def check(paths: tuple[str, ...], workspace: str, uid: int, gid: int) -> tuple[str, ...]:
    """The spec's ``expose`` at create, each checked (sorted, normalised); a missing one is NOT_FOUND.

    Kept as given, not resolved: a link to a toolchain (uv's minor-version directory) is
    where the venv looks for it, so the jail shows the directory at the link's path.
    """
    if not paths:
        return ()
    given, read = set(), _read()
    for path in paths:
        path = os.path.normpath(path)
        if _checked(path, workspace, uid, gid, read, at_create=True) is None:
            raise CcwError("NOT_FOUND", f"expose {path!r} does not exist; expose existing directories only",
                           {"argument": "expose", "path": path})
        given.add(path)
    return tuple(sorted(given))


def binds(capsule: Capsule, uid: int, gid: int) -> tuple[mounts.Bind, ...]:
    """The jail's read-only binds of the capsule's exposed directories, checked again now."""
    if not capsule.spec.expose:
        return ()
    shown, read = [], _read()
    for path in capsule.spec.expose:
        real = _checked(path, capsule.spec.workspace, uid, gid, read)
        if real is not None:
            shown.append(mounts.Bind(real, path, exact=True))
    return tuple(shown)
