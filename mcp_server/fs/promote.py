"""All-or-nothing, crash-safe promotion of a capsule's changes into the real workspace.

Some facts this module is built on:

- ``rename(2)`` within one directory atomically replaces the target, and never follows a
  symlink at the target name: writing through a planted link is impossible that way.
  So every new file's bytes go first to a temporary name in the *same* directory, are
  fsynced, and only then renamed over the target.
- A rename is durable only once its directory reaches the disk; so is a new journal
  file.  ``syncfs`` on the workspace's filesystem flushes every temp file (and later
  every rename) in one call, where an fsync per file costs one journal commit each.
- Parents are reached through ``RootView`` (openat2 ``RESOLVE_BENEATH |
  RESOLVE_NO_SYMLINKS``): if a capsule turned ``src/`` into a symlink to ``/etc``, the
  walk to ``src/x`` fails with ELOOP before anything is written, wherever the link
  points.
- A crash can stop the process between any two syscalls.  The journal in the state dir
  (``promotions/<txid>.json``) makes recovery decidable: in state ``prepared`` only
  temporary files exist, so recovery removes them (roll back); in state ``committing``
  every temporary file is complete and durable, so recovery finishes the renames,
  deletions and mode changes (roll forward).  Each step of the commit phase is
  idempotent, so recovery may itself crash and run again.  Either way, once recovery
  ran, the workspace holds all of the change or none of it.

The commit phase orders its steps so that every intermediate tree is well formed:
deletions deepest first (a directory becomes a file only after its children are gone),
then directories, then files and symlinks shallowest first, then mode changes.

Owners are what the host's root would leave (issue 25: a root caller on a checkout of
another uid): a file the promotion replaces keeps its owner and group, as ``echo >
file`` would, although its bytes arrive by rename; a new file, directory or symlink is
the promoting process's, as one the host's root creates is root's.  Only root can give a
file to another uid, so a promoter that is not root leaves its own uid on what it
replaces (its capsule ran as that uid, which the host would not have let write another
uid's file anyway).  The owner is read with ``fstatat(AT_SYMLINK_NOFOLLOW)`` in the
parent reached through RootView, and only a regular file's is kept: a symlink or
directory replaced by a file gives it nothing.

No file gets a setuid or setgid bit from a promotion, whatever its op says: the bits are
masked off here, at the write and at the mode change, where the mode reaches the disk.
The front end's hazard check (core/hazards.py) refuses them before anything is written;
this is the floor beneath it, so a bit that reached an op some other way (a journal
from an older version rolled forward, a caller that skipped the check) is still never
written.  Directories keep theirs: a setgid directory only passes its group on.

A file's runs of zeros are written as holes (``_write_temp``): a capsule's sparse file
costs its disk nothing (``truncate -s 900M``), and written out densely, a few of them
would fill the host's disk from a capsule that used none of its own.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import stat as stat_mod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_server.core.hazards import SETID_BITS
from mcp_server.fs.view import DirFds, RootView, lstat
from sandbox import syscalls
from sandbox.errors import CcwError, from_oserror, wrap_oserror

# Tests set this to a step name to have the process SIGKILL itself right after that step:
# the crash-recovery tests use it to stop a promotion at every point that matters.
CRASH_ENV = "CCW_TEST_PROMOTE_CRASH_AFTER"
STEPS = ("prepared", "journal_committing", "first_commit_op", "all_ops", "done")


@dataclass
class Op:
    """One change to make: write (file bytes), symlink, mkdir, delete (file, link or dir), chmod."""

    action: str
    path: str
    mode: int | None = None  # permission bits for write/mkdir/chmod
    target: str | None = None  # symlink target
    temp: str | None = None  # temporary name beside the target (write/symlink)


@dataclass
class Transaction:
    """A promotion in progress, as the journal records it."""

    txid: str
    workspace: str
    state: str
    ops: list[Op] = field(default_factory=list)
    created_dirs: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        """The journal file's contents."""
        body = {
            "txid": self.txid, "workspace": self.workspace, "state": self.state,
            "created_dirs": self.created_dirs, "ops": [op.__dict__ for op in self.ops],
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Transaction:
        """Parse a journal file."""
        raw = json.loads(data)
        return cls(
            txid=raw["txid"],
            workspace=raw["workspace"],
            state=raw["state"],
            ops=[Op(**op) for op in raw["ops"]],
            created_dirs=list(raw.get("created_dirs", [])),
        )


def _depth(path: str) -> int:
    return path.count("/")


def order_ops(ops: list[Op]) -> list[Op]:
    """Deletions deepest first, then mkdirs and writes shallowest first, then chmods."""
    deletes = sorted((o for o in ops if o.action == "delete"), key=lambda o: (-_depth(o.path), o.path))
    creates = sorted(
        (o for o in ops if o.action in ("mkdir", "write", "symlink")),
        key=lambda o: (_depth(o.path), o.action != "mkdir", o.path),
    )
    chmods = sorted((o for o in ops if o.action == "chmod"), key=lambda o: o.path)
    return deletes + creates + chmods


def _crash_point(step: str) -> None:
    if os.environ.get(CRASH_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


class Promoter:
    """Runs promotions for one state dir and recovers interrupted ones."""

    def __init__(self, state_root: Path) -> None:
        self.journal_dir = state_root / "promotions"
        with wrap_oserror("create promotion journal dir", str(self.journal_dir)):
            self.journal_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    # --- journal -------------------------------------------------------------------
    def _journal_path(self, txid: str) -> Path:
        return self.journal_dir / f"{txid}.json"

    def _save(self, tx: Transaction) -> None:
        path = self._journal_path(tx.txid)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(tx.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(str(self.journal_dir))

    def _forget(self, tx: Transaction) -> None:
        self._journal_path(tx.txid).unlink(missing_ok=True)
        _fsync_dir(str(self.journal_dir))

    # --- the two phases --------------------------------------------------------------
    def promote(self, workspace: str, ops: list[Op], content: Callable[[Op], bytes]) -> list[str]:
        """Apply ``ops`` to ``workspace`` all or nothing; returns the paths applied, sorted."""
        tx = Transaction(txid=secrets.token_hex(8), workspace=workspace, state="preparing", ops=order_ops(ops))
        with RootView.open(workspace) as view:
            try:
                self._prepare(view, tx, content)
            except BaseException:
                self._rollback(view, tx)
                raise
            _crash_point("prepared")
            tx.state = "committing"
            self._save(tx)
            _crash_point("journal_committing")
            self._commit(view, tx)
        return sorted({op.path for op in tx.ops}, key=lambda p: p.encode())

    def _prepare(self, view: RootView, tx: Transaction, content: Callable[[Op], bytes]) -> None:
        # The journal names every temp file and directory before any exists, so a crash
        # at any point of this phase can be undone by name.
        known_dirs: set[str] = set()
        for op in tx.ops:
            if op.action not in ("write", "symlink"):
                continue
            parent, _, name = op.path.rpartition("/")
            if parent:
                tx.created_dirs.extend(_missing_dirs(view, parent, known_dirs))
            op.temp = (parent + "/" if parent else "") + f".{name[:100]}.ccw-{tx.txid}.tmp"
        self._save(tx)
        for created in tx.created_dirs:
            view.makedirs(created)
        with DirFds(view) as dirs:
            for op in tx.ops:
                if op.temp is None:
                    continue
                temp_dir, temp_name = _split(op.temp)
                dir_fd = dirs.get(temp_dir, "promote")
                if op.action == "write":
                    mode = (op.mode if op.mode is not None else 0o644) & ~SETID_BITS
                    _write_temp(dir_fd, temp_name, op.temp, content(op), mode, _kept_owner(dir_fd, _split(op.path)[1]))
                else:
                    _symlink_at(dir_fd, temp_name, op.target or "", op.temp)
        # One syncfs makes every temp file durable: far cheaper than an fsync per file,
        # and the commit phase needs only that all of them are on disk.
        with wrap_oserror("promote: syncfs", tx.workspace):
            syscalls.syncfs(view.fd)
        tx.state = "prepared"

    def _commit(self, view: RootView, tx: Transaction) -> None:
        # A path that is deleted and then created again (a type change) must not be
        # deleted a second time when recovery replays the commit after the creation.
        creates = {op.path: op for op in tx.ops if op.action in ("write", "symlink", "mkdir")}
        with DirFds(view) as dirs:
            self._apply_ops(view, dirs, tx, creates)
        # The renames, deletions and mode changes reach the disk together.
        with wrap_oserror("promote: syncfs", tx.workspace):
            syscalls.syncfs(view.fd)
        _crash_point("all_ops")
        tx.state = "done"
        self._forget(tx)
        _crash_point("done")

    def _apply_ops(self, view: RootView, dirs: DirFds, tx: Transaction, creates: dict[str, Op]) -> None:
        for i, op in enumerate(tx.ops):
            if op.action == "delete":
                if not _already_recreated(view, creates.get(op.path)):
                    dirs.forget()  # a directory may go: no cached descriptor may outlive it
                    remove_tree(view, op.path)
            elif op.action == "mkdir":
                if view.exists(op.path) and view.stat(op.path).st_mode & 0o170000 != 0o040000:
                    view.unlink(op.path)
                view.makedirs(op.path)
                if op.mode is not None:
                    _chmod(view, op.path, op.mode)
            elif op.action in ("write", "symlink"):
                assert op.temp is not None
                _rename_into_place(view, dirs, op.temp, op.path)
            elif op.action == "chmod" and op.mode is not None and view.exists(op.path):
                _chmod(view, op.path, op.mode)
            if i == 0:
                _crash_point("first_commit_op")

    def _rollback(self, view: RootView, tx: Transaction) -> None:
        for op in tx.ops:
            if op.temp and view.exists(op.temp):
                view.unlink(op.temp)
        for created in sorted(tx.created_dirs, key=lambda p: -_depth(p)):
            try:
                view.rmdir(created)
            except CcwError:
                pass  # not empty: someone else put something there; leave it
        self._forget(tx)

    def recover(self) -> list[dict[str, Any]]:
        """Finish or undo every interrupted promotion; returns what was done to each."""
        outcomes = []
        for path in sorted(self.journal_dir.glob("*.json")):
            try:
                tx = Transaction.from_json(path.read_bytes())
            except (ValueError, KeyError, TypeError):
                # A journal torn before its first fsync completed: nothing was committed.
                path.unlink()
                outcomes.append({"txid": path.stem, "action": "discarded_torn_journal"})
                continue
            with RootView.open(tx.workspace) as view:
                if tx.state == "committing":
                    self._commit(view, tx)
                    outcomes.append({"txid": tx.txid, "action": "rolled_forward", "workspace": tx.workspace})
                else:
                    self._rollback(view, tx)
                    outcomes.append({"txid": tx.txid, "action": "rolled_back", "workspace": tx.workspace})
        for stale in self.journal_dir.glob("*.tmp"):
            stale.unlink()
        return outcomes


# --- steps beneath the root, each resolved with RESOLVE_NO_SYMLINKS via RootView.open_fd ---


def _already_recreated(view: RootView, create: Op | None) -> bool:
    """True if the creation that follows a deletion of the same path already happened."""
    if create is None:
        return False
    if create.action == "mkdir":
        return view.exists(create.path) and view.stat(create.path).st_mode & 0o170000 == 0o040000
    return create.temp is not None and not view.exists(create.temp)


def _dir_fd(view: RootView, rel: str, what: str) -> int:
    return view.open_fd(rel or ".", os.O_RDONLY | os.O_DIRECTORY, write=True, what=what)


def _split(rel: str) -> tuple[str, str]:
    head, _, name = rel.rpartition("/")
    return head or ".", name


def _missing_dirs(view: RootView, rel: str, known: set[str]) -> list[str]:
    """Directories of ``rel`` that do not exist yet, shallowest first (``known``: seen to exist)."""
    missing = []
    parts = rel.split("/")
    for i in range(len(parts)):
        path = "/".join(parts[: i + 1])
        if path in known:
            continue
        side = lstat(view, path)
        if side is None:
            missing.append(path)
        elif side.kind != "dir":
            raise CcwError(
                "CONFLICT",
                f"cannot promote beneath {path!r}: it is not a directory in the workspace "
                "(a symlink or file is in the way); inspect the workspace and the capsule diff",
                {"path": path},
            )
        known.add(path)
    return missing


def _kind_at(dir_fd: int, name: str) -> int | None:
    """The file type bits of ``name`` in a directory (the link itself for a symlink), or None."""
    try:
        return stat_mod.S_IFMT(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return None


def _rename_into_place(view: RootView, dirs: DirFds, temp: str, rel: str) -> None:
    """Rename a prepared temp file over ``rel``; done already if the temp file is gone.

    One ``renameat`` per file on the common path: the rename itself tells the cases
    apart (ENOENT: recovery replaying a commit that got past this file; EISDIR: a
    directory is in the way, left by a type change), so nothing is stat'ed beforehand.
    """
    head, name = _split(rel)
    temp_name = _split(temp)[1]
    parent = dirs.get(head, "promote")
    try:
        os.rename(temp_name, name, src_dir_fd=parent, dst_dir_fd=parent)
        return
    except FileNotFoundError:
        return
    except OSError as exc:
        if _kind_at(parent, name) != stat_mod.S_IFDIR:
            raise from_oserror(exc, "promote: rename into place", rel) from exc
    dirs.forget()  # a directory goes: no cached descriptor may outlive it
    remove_tree(view, rel)
    parent = dirs.get(head, "promote")
    with wrap_oserror("promote: rename into place", rel):
        os.rename(temp_name, name, src_dir_fd=parent, dst_dir_fd=parent)


def _chmod(view: RootView, rel: str, mode: int) -> None:
    """Set ``rel``'s permission bits, setuid and setgid masked off unless it is a directory.

    The kind is read from the descriptor that is changed, so a file swapped in for a
    directory meanwhile still loses the bits.
    """
    fd = view.open_fd(rel, os.O_RDONLY | os.O_NOFOLLOW, write=True, what="chmod")
    try:
        with wrap_oserror("promote: chmod", rel):
            if not stat_mod.S_ISDIR(os.fstat(fd).st_mode):
                mode &= ~SETID_BITS
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _kept_owner(parent: int, name: str) -> tuple[int, int] | None:
    """The owner a replaced regular file keeps (root only; see the module docstring), else None."""
    if os.geteuid() != 0:
        return None
    try:
        old = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return (old.st_uid, old.st_gid) if stat_mod.S_ISREG(old.st_mode) else None


HOLE_BLOCK = 1 << 16  # zeros this long, so aligned, become a hole; files shorter are written whole
_ZEROS = bytes(HOLE_BLOCK)


def _zeros_at(data: bytes, at: int) -> bool:
    """Whether ``data`` holds a whole ``HOLE_BLOCK`` of zeros at ``at`` (its ends looked at first:
    a block of data rarely starts and ends with zero; the slice's compare is one memcmp)."""
    end = at + HOLE_BLOCK
    return end <= len(data) and data[at] == 0 and data[end - 1] == 0 and data[at:end] == _ZEROS


def _write_sparse(fd: int, data: bytes) -> None:
    """``data`` at the start of the empty file ``fd``, each ``HOLE_BLOCK`` of zeros skipped (a hole)."""
    mv, at = memoryview(data), 0
    while at < len(data):
        if _zeros_at(data, at):
            at += HOLE_BLOCK
            continue
        end = at + HOLE_BLOCK
        while end < len(data) and not _zeros_at(data, end):
            end += HOLE_BLOCK
        end = min(end, len(data))
        while at < end:
            at += os.pwrite(fd, mv[at:end], at)
    os.ftruncate(fd, len(data))  # the length, where the file ends in a hole


def _write_temp(parent: int, name: str, rel: str, data: bytes, mode: int, owner: tuple[int, int] | None) -> None:
    with wrap_oserror("promote: write", rel):
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
        try:
            if len(data) >= HOLE_BLOCK:
                _write_sparse(fd, data)
            else:
                mv = memoryview(data)
                while mv:
                    mv = mv[os.write(fd, mv) :]
            if owner is not None:
                os.fchown(fd, *owner)  # before the mode: chown would clear set-id bits (none are written)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


def _symlink_at(parent: int, name: str, target: str, rel: str) -> None:
    with wrap_oserror("promote: symlink", rel):
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        os.symlink(target, name, dir_fd=parent)


def make_symlink(view: RootView, target: str, rel: str) -> None:
    """Create (or replace) a symlink at ``rel``; its parent is reached without links."""
    head, name = _split(rel)
    parent = _dir_fd(view, head, "promote")
    try:
        _symlink_at(parent, name, target, rel)
    finally:
        os.close(parent)


def remove_tree(view: RootView, rel: str) -> None:
    """Remove a file, symlink or directory tree (links are removed, never followed)."""
    if not view.exists(rel):
        return
    if view.stat(rel).st_mode & 0o170000 == 0o040000:
        for name, _kind in view.listdir(rel):
            remove_tree(view, f"{rel}/{name}")
        view.rmdir(rel)
    else:
        view.unlink(rel)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
