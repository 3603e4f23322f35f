"""Who may do what: the privileged side's re-checks, in one place.

The front end validates every request before it is sent, and the helper checks every
argument again when it reads the request (sandbox/ops.py: "in case something manages to
send hacked requests", bubblewrap's words).  What only the host can answer is checked
here: whose capsule it is, whether the caller may reach a directory, where a path
really leads.

* **Ownership**: a capsule belongs to the uid that made it; any other uid gets
  PERMISSION_DENIED, root included (``check_owner``).
* **Directories**: a caller may create a capsule only over a directory it can write and
  search, or with a ``base`` it can read (the workspace is then only where the jail
  shows the base, hostdirs.py says why).  The helper opens the directory first
  (pinning it); when the caller is another uid, a forked child switches to the caller's
  uid, gid and supplementary groups, opens the same path (so every ancestor is searched
  with the caller's rights), checks it is the same inode and asks
  ``access(W_OK|X_OK)`` of it (so ACLs and read-only mounts count).  The overlay is then
  mounted from the pinned descriptor, so a path swapped after the check changes
  nothing.  When the caller's uid is the helper's own, ``access()`` with effective ids
  answers directly (``_check_access``).  A refusal names the caller and the directory's
  owner as the host knows them, not as a rootless helper's namespace does (its user is
  0 there, and every other user 65534), and the ways forward (``_refused``).
* **The state dir**: a workspace inside the helper's state dir is refused (a capsule
  could then see or change other capsules); the state dir inside the workspace is
  allowed (``./.ccw-state`` in a repo), because the capsule dirs are 0700: a jail sees
  them in its lower layer but cannot enter them.  A path is checked as given and again
  as resolved from the pinned descriptor, since a symlink may lead elsewhere.
* **System directories and homes**: a capsule may not show the host's secrets, so the
  workspace and the base are checked against ``hostdirs.check_capsule_dir`` (its argument is
  there) as resolved from the pinned descriptor, and again under every other path the
  same directory is mounted at (a bind mount of /etc elsewhere is /etc;
  ``mountinfo.other_paths``).  The caller's uid is taken on the host: a rootless
  helper's namespace maps its one user to 0 (``host_uid``).
* **Terminals**: an exec on a terminal gets the descriptor its caller sent as its
  stdin, stdout and stderr; only a pty slave the caller owns (the UNIX98 slave majors
  136 to 143, ``st_uid`` the caller's), open read-write, is taken (``check_terminal``).
  Anything else could be a way out: a directory or O_PATH descriptor lies outside the
  jail's mount namespace (``openat``/``fchdir`` from it escape), a socket may reach a
  service the jail must not.
* **Private dirs**: each capsule's ``tmp`` (sticky, like /tmp) and ``home`` (the caller's
  own, 0700) are made here, with the owner the checks above allowed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import stat
from collections.abc import Iterator, Sequence
from typing import Any

from sandbox import checks, hostdirs, mountinfo, namespaces
from sandbox.errors import CcwError, from_oserror
from sandbox.homes import Home, login_homes
from sandbox.hostdirs import inside, refusal
from sandbox.meta import Capsule

# --- the caller -------------------------------------------------------------------------


def check_uid_gid(uid: Any, gid: Any) -> None:
    """A caller's uid and gid are ids the kernel can hold (not -1)."""
    for name, value in (("uid", uid), ("gid", gid)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32 - 1:
            raise CcwError("INVALID_ARGUMENT", f"{name} must be an integer in [0, 2**32-1), got {value!r:.40}")


def check_owner(capsule: Capsule, caller_uid: int) -> None:
    """The caller owns the capsule; anyone else (root included) is denied."""
    if capsule.meta["owner_uid"] != caller_uid:
        raise CcwError("PERMISSION_DENIED", f"capsule {capsule.capsule_id} belongs to another user",
                       {"capsule_id": capsule.capsule_id})


# --- arguments --------------------------------------------------------------------------


def check_dir_arg(name: str, value: Any, state_dir: str, allow_state: bool = False) -> str:
    """An absolute directory argument, normalised, and not inside the helper's state dir."""
    checks.abs_path(name, value)
    path = os.path.normpath(value)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    _check_resolved(name, path, state_dir, allow_state)
    return path


def _check_resolved(name: str, path: str, state_dir: str, allow_state: bool) -> None:
    """``path`` is not inside the state dir (with ``allow_state``: its capsules dir); / and the
    other system directories are ``_check_place``'s."""
    forbidden = os.path.join(state_dir, "capsules") if allow_state else state_dir
    if inside(path, forbidden):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"{name} {path!r} lies inside the helper's state dir {forbidden!r}; use a directory outside it",
        )


def _open_dir(path: str, name: str) -> int:
    """An O_PATH descriptor pinning the directory ``path`` (the ``name`` argument)."""
    try:
        return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise from_oserror(exc, f"open {name}", path, f"the {name} must be an existing directory") from exc


def _check_access(fd: int, path: str, uid: int, gid: int, mode: int, verb: str) -> None:
    """Can ``uid``/``gid`` (with its supplementary groups) reach ``path`` and ``verb`` it?

    ``fd`` pins the directory the helper will mount; the answer is about that inode.
    """
    link = f"/proc/self/fd/{fd}"
    if uid == os.geteuid():
        ok = os.access(link, mode, effective_ids=True)
    else:
        try:
            user = pwd.getpwuid(uid).pw_name
            groups = os.getgrouplist(user, gid)
        except KeyError:
            groups = [gid]
        ok = _access_as(fd, path, uid, gid, groups, mode)
    if not ok:
        raise _refused(fd, path, uid, verb)


def _refused(fd: int, path: str, uid: int, verb: str) -> CcwError:
    """``refusal`` for the directory ``fd``, its caller and owner taken out of a rootless helper's
    namespace (which calls its user 0, and every user it does not map 65534)."""
    uid_ranges = namespaces.read_id_maps()[0]
    owner = os.fstat(fd).st_uid
    mapped = any(start <= owner < start + count for start, _, count in uid_ranges)
    return refusal(path, host_uid(uid), namespaces.outside_id(owner, uid_ranges) if mapped else None, verb)


def _access_as(fd: int, path: str, uid: int, gid: int, groups: list[int], mode: int) -> bool:
    """In a forked child with the caller's credentials: same inode reachable, and ``mode`` granted."""
    pinned = os.fstat(fd)
    pid = os.fork()
    if pid == 0:  # the child: only raw os calls, then _exit
        code = 1
        try:
            os.setgroups(groups)
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            own = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            st = os.fstat(own)
            if (st.st_dev, st.st_ino) == (pinned.st_dev, pinned.st_ino) and os.access(f"/proc/self/fd/{own}", mode):
                code = 0
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@contextlib.contextmanager
def pinned_lower(workspace: str, base: str | None, uid: int, gid: int, state_dir: str) -> Iterator[tuple[int, str]]:
    """The capsule's lower dir (``base``, else the workspace) pinned by a descriptor, with its
    resolved path, once the caller may write the workspace (without a base) and read the base; closed after."""
    # With a base, the workspace is only where the jail shows it: a replay on another
    # machine, or after the workspace was deleted, has no directory there, and a replay
    # by another user of this host finds the maker's, which it may not write.  Nothing
    # is read or written at that path on the host (promotion writes there as its caller,
    # and the kernel refuses that caller there), so only the place is checked.
    ws_fd = None if base is not None and not os.path.lexists(workspace) else _open_dir(workspace, "workspace")
    base_fd = _open_dir(base, "base") if base is not None else None
    try:
        _check_place("workspace", ws_fd, workspace, uid, shown_only=base is not None)
        if base_fd is not None:
            _check_place("base", base_fd, base or "", uid, shown_only=False)
        if ws_fd is not None and base is None:
            _check_access(ws_fd, workspace, uid, gid, os.W_OK | os.X_OK, "write")
        if ws_fd is not None:
            # Check the resolved path again: a symlink in the argument may lead elsewhere.
            _check_resolved("workspace", os.readlink(f"/proc/self/fd/{ws_fd}"), state_dir, allow_state=False)
        if base_fd is not None:
            _check_access(base_fd, base or "", uid, gid, os.R_OK | os.X_OK, "read")
        lower_fd = base_fd if base_fd is not None else ws_fd
        assert lower_fd is not None
        lower_real = os.readlink(f"/proc/self/fd/{lower_fd}")
        _check_resolved("base" if base is not None else "workspace", lower_real, state_dir,
                        allow_state=base is not None)
        yield lower_fd, lower_real
    finally:
        if ws_fd is not None:
            os.close(ws_fd)
        if base_fd is not None:
            os.close(base_fd)


def host_uid(uid: int) -> int:
    """The caller's uid on the host (a rootless helper's user namespace maps its user to 0)."""
    return namespaces.outside_id(uid, namespaces.read_id_maps()[0])


def _check_place(name: str, fd: int | None, given: str, uid: int, shown_only: bool) -> None:
    """``hostdirs.check_capsule_dir`` on the directory ``fd`` under each path it has (``given``
    itself when nothing is there: a workspace that is only where a base is shown)."""
    paths = [given]
    if fd is not None:
        resolved = os.readlink(f"/proc/self/fd/{fd}")
        paths = [resolved, *mountinfo.other_paths(fd, resolved)]
    homes, caller = login_homes(), host_uid(uid)
    for path in paths:
        hostdirs.check_capsule_dir(name, path, caller, homes, shown_only=shown_only, given=given)


def make_private_dirs(root: str, uid: int, gid: int, exist_ok: bool = False) -> None:
    """tmp (sticky, like /tmp) and home (the caller's own), kept across execs."""
    for name, mode, owner in (("tmp", 0o1777, (0, 0)), ("home", 0o700, (uid, gid))):
        path = os.path.join(root, name)
        try:
            os.mkdir(path)
        except FileExistsError:
            if exist_ok:
                continue
            raise
        os.chown(path, *owner)
        os.chmod(path, mode)


def check_shown_dir(name: str, fd: int, given: str, uid: int, gid: int,
                    read: tuple[tuple[Home, ...], Sequence[mountinfo.Mount]] | None = None) -> None:
    """A directory the jail shows besides the workspace (a git dir, a toolchain), pinned by ``fd``:
    ``hostdirs.check_expose_dir`` under each path it has, and readable and searchable by the caller.
    ``read``: ``login_homes()`` and our mount table, when the caller checks many dirs at once."""
    resolved = os.readlink(f"/proc/self/fd/{fd}")
    homes, mounts = read or (login_homes(), mountinfo.table())
    caller = host_uid(uid)
    for path in [resolved, *mountinfo.paths_of(mounts, mountinfo.mount_id(fd), resolved)]:
        hostdirs.check_expose_dir(name, path, caller, homes)
    _check_access(fd, given, uid, gid, os.R_OK | os.X_OK, "read")


PTY_SLAVE_MAJORS = range(136, 144)  # UNIX98_PTY_SLAVE_MAJOR and the 7 after it (Documentation/admin-guide/devices.txt)


def _described(fd: int, what: str) -> tuple[os.stat_result, int]:
    """A descriptor an exec carries: its stat and its open flags (what to check it by)."""
    try:
        return os.fstat(fd), fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError as exc:
        raise from_oserror(exc, f"fstat of the exec's {what}") from exc


def check_terminal(fd: int | None, caller_uid: int) -> None:
    """Refuse (INVALID_ARGUMENT) a descriptor that is not a pty slave of ``caller_uid``'s, open
    read-write; None (an exec on pipes, which carries no descriptor) passes."""
    if fd is None:
        return
    st, flags = _described(fd, "terminal")
    if not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) not in PTY_SLAVE_MAJORS:
        raise CcwError("INVALID_ARGUMENT", "an exec on a terminal takes the slave side of a pseudo-terminal "
                       "(a /dev/pts/N descriptor, as os.openpty gives) and nothing else; open one and send it")
    if flags & (os.O_ACCMODE | os.O_PATH) != os.O_RDWR:
        raise CcwError("INVALID_ARGUMENT", "the exec's terminal must be open read-write (O_RDWR, not O_PATH)")
    if st.st_uid != caller_uid:
        raise CcwError("INVALID_ARGUMENT", f"the exec's terminal belongs to uid {st.st_uid}, not to the caller "
                       f"({caller_uid}); open a pseudo-terminal of your own")


def check_stdin(fd: int | None) -> None:
    """Refuse (INVALID_ARGUMENT) a descriptor that is not the read end of a pipe: it becomes a
    jail's stdin, and only a pipe names no file the jail could reach through it."""
    if fd is None:
        return
    st, flags = _described(fd, "stdin")
    if not stat.S_ISFIFO(st.st_mode) or flags & (os.O_ACCMODE | os.O_PATH) != os.O_RDONLY:
        raise CcwError("INVALID_ARGUMENT", "an exec with stdio \"stdin\" takes the read end of a pipe "
                       "(os.pipe()'s first descriptor) and nothing else; make one and send it")
