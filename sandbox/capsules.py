"""Capsules: the registry, their lifecycle on disk, exec orchestration, crash recovery.

A capsule is one overlay superblock (see overlay.py) plus a few dirs under
``<state_dir>/capsules/<id>/``: ``upper`` and ``work`` (overlay), ``merged`` (the mount
point), ``tmp`` and ``home`` (the jail's /tmp and $HOME, kept across execs) and
``meta.json`` (who owns it and how to mount it again).  With a disk limit (the default
when the helper is privileged, see disk.py) ``upper``, ``work``, ``tmp`` and ``home`` live
on the capsule's own ext4 disk, ``disk.img`` mounted at ``disk/``, so that nothing a
command writes can outgrow it.  Choices made here:

* **Ids** are ``cap_<13-digit ms>_<8 hex>``; within one millisecond the hex part is
  made to increase, so ids sort by creation within a helper's life.
* **Creation is O(1)** in the workspace's size: a handful of mkdirs, one small JSON
  file, one rename and one mount.  Nothing walks or copies the workspace.  The upper
  dir's root takes the workspace root's owner and mode, because an overlay shows its
  upper root's attributes as the merged root's.
* **Half-made states are named**: a capsule is built as ``.new-<id>`` and renamed into
  place, destroyed by renaming to ``.dead-<id>`` before its files are removed, so
  ``recover()`` knows what to delete after a crash.  meta.json is written with
  rename-over (not fsynced: a killed helper loses nothing, the page cache survives it).
* **Authorisation**: a capsule belongs to the uid that made it; any other uid gets
  PERMISSION_DENIED, root included.  A caller may create a capsule only over a
  directory it can write and search, and with a ``base`` it can read.  The helper
  opens the directory first (pinning it); when the caller is another uid, a forked
  child switches to the caller's uid, gid and supplementary groups, opens the same
  path (so every ancestor is searched with the caller's rights), checks it is the
  same inode and asks ``access(W_OK|X_OK)`` of it (so ACLs and read-only mounts count).
  The overlay is then mounted from the pinned descriptor, so a path swapped after the
  check changes nothing.  When the caller's uid is the helper's own, ``access()`` with
  effective ids answers directly.
* **Fork** stacks the child on ``parent upper : parent lowers``.  A lower layer must
  not change under a mount, so while a capsule has forks it is *frozen*: its mount is
  made read-only by the kernel (writes through open_root descriptors fail with EROFS;
  freezing fails with CONFLICT while a file is open for writing) and exec on it is
  refused.  It thaws when its last fork is destroyed.  ``changes`` of a fork are
  relative to the base, i.e. they include the parent's changes: what promoting the
  fork would apply.  ``destroy`` refuses a capsule that still has forks.
* **Workspace inside the state dir is refused; the state dir inside the workspace is
  allowed** (``./.ccw-state`` in a repo): the capsule dirs are 0700, so a jail sees
  them in its lower layer but cannot enter them.  Such capsules cannot be forked,
  though: overlayfs refuses (ELOOP) a lower layer inside another lower layer, and a
  fork's lowers would be the parent's upper inside the workspace; fork says so.
* **recover()** assumes it is the only helper using this state dir.  It detaches every
  mount left under ``capsules/`` by a dead helper, deletes ``.new-*``/``.dead-*`` dirs and
  capsules whose meta.json is unreadable or whose upper dir (or disk image) or parent
  is gone, keeps every other capsule and mounts it again (disk first, and its
  ancestors' disks, whose uppers are its lower layers) on first use.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandbox import disk, overlay
from sandbox.errors import CcwError, from_oserror
from sandbox.spec import (
    DISK_MB_MAX,
    DISK_MB_MIN,
    ENV_NAME_RE,
    MAX_ARG_BYTES,
    MAX_CLOCK_OFFSET_SEC,
    MAX_OUTPUT_CAP,
    MAX_STDIN,
    MAX_TIMEOUT_MS,
    NETWORKS,
)

log = logging.getLogger("ccw.capsules")

ID_RE = re.compile(r"cap_\d{13}_[0-9a-f]{8}")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_HOME = "/home/ccw"
DEFAULT_LANG = "C.UTF-8"
ALWAYS_ALLOWED_ENV = frozenset({"PATH", "HOME", "LANG"})
DEFAULT_TIMEOUT_MS = 300_000
DEFAULT_OUTPUT_CAP = 1 << 20
MAX_FORK_DEPTH = 64  # overlay allows 500 lowers; deeper what-if chains are a bug
_Argv = list[str]  # the class's own ``list`` method shadows the builtin in its annotations
_LIMIT_KEYS = ("memory_mb", "pids_max", "cpu_ms", "disk_mb")
_ON_DISK = frozenset({"upper", "work", "tmp", "home"})  # what a capsule disk holds
# A disk counts as full after an exec with less than 1% (at least 4 MiB) free: a write
# that hit ENOSPC leaves a little behind (a short final write, and ext4's delalloc
# reserves room for metadata of dirty data that writeback later gives back).
DISK_FULL_MIN_KB = 4096
_META_VERSION = 1


def _now_iso(offset_sec: int = 0) -> str:
    now = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset_sec)
    return now.isoformat(timespec="microseconds")


@dataclass
class Capsule:
    """A capsule known to this helper: its meta.json plus runtime state."""

    capsule_id: str
    root: str  # <state_dir>/capsules/<id>
    meta: dict[str, Any]
    mounted: bool = False
    busy: bool = False
    disk_ready: bool = False
    children: set[str] = field(default_factory=set)

    @property
    def disk_mb(self) -> int | None:
        """The size of the capsule's own disk, or None for a capsule without one."""
        value = self.meta.get("disk_mb")
        return value if isinstance(value, int) else None

    def path(self, name: str) -> str:
        """One of upper, work, merged, tmp, home, meta.json, disk, disk.img."""
        if name in _ON_DISK and self.disk_mb is not None:
            return os.path.join(self.root, "disk", name)
        return os.path.join(self.root, name)

    @property
    def ancestors(self) -> list[str]:
        return list(self.meta["ancestors"])

    @property
    def lowers(self) -> list[str]:
        """The overlay's lower stack, top first: ancestors' uppers, then the base."""
        return list(self.meta["lowers"])

    @property
    def base_lowers(self) -> list[str]:
        return self.lowers[len(self.ancestors) :]

    def summary(self) -> dict[str, Any]:
        state = "busy" if self.busy else "frozen" if self.children else "ready" if self.mounted else "unmounted"
        return {
            "capsule_id": self.capsule_id,
            "workspace": self.meta["workspace"],
            "parent": self.meta["parent"],
            "created_at": self.meta["created_at"],
            "state": state,
        }


class CapsuleManager:
    """Every capsule under ``<state_dir>/capsules``; the only writer of that directory."""

    def __init__(self, state_dir: str, rootless: bool, disk_mb: int | None = disk.DEFAULT_MB) -> None:
        """``disk_mb``: the default size of each capsule's disk; None or 0 for none."""
        self.state_dir = os.path.realpath(state_dir)
        self.capsules_dir = os.path.join(self.state_dir, "capsules")
        self.rootless = rootless
        self.disks: disk.Disks | None = None
        self.disk_reason: str | None = "disk limits are turned off (CCW_CAPSULE_DISK_MB=0)"
        if disk_mb:
            self.disk_reason = disk.unavailable_reason()
            if rootless:
                self.disk_reason = "a rootless helper cannot mount loop devices"
            if self.disk_reason is None:
                self.disks = disk.Disks(os.path.join(self.state_dir, "disks"), disk_mb)
        self._lock = threading.RLock()
        self._capsules: dict[str, Capsule] = {}
        self._last_id = (0, 0)
        self._exec_count = 0
        self._isolation: dict[str, Any] | None = None
        with contextlib.suppress(FileExistsError):
            os.makedirs(self.capsules_dir, mode=0o700)

    # --- ids, lookup, authorisation ------------------------------------------------

    def _new_id(self) -> str:
        with self._lock:
            millis = time.time_ns() // 1_000_000
            last_ms, last_hex = self._last_id
            if millis <= last_ms:
                millis, rand = last_ms, last_hex + 1 + secrets.randbelow(1 << 16)
                if rand >= 1 << 32:
                    millis, rand = last_ms + 1, secrets.randbelow(1 << 31)
            else:
                rand = secrets.randbelow(1 << 31)  # leave room above for same-ms successors
            self._last_id = (millis, rand)
            return f"cap_{millis:013d}_{rand:08x}"

    def _get(self, capsule_id: Any, caller_uid: int) -> Capsule:
        if not isinstance(capsule_id, str) or not ID_RE.fullmatch(capsule_id):
            raise CcwError("INVALID_ARGUMENT", f"{capsule_id!r:.80} is not a capsule id (cap_<ms>_<hex>)")
        with self._lock:
            capsule = self._capsules.get(capsule_id)
        if capsule is None:
            raise CcwError("NOT_FOUND", f"capsule {capsule_id} not found; list your capsules or create one",
                           {"capsule_id": capsule_id})
        if capsule.meta["owner_uid"] != caller_uid:
            raise CcwError("PERMISSION_DENIED", f"capsule {capsule_id} belongs to another user",
                           {"capsule_id": capsule_id})
        return capsule

    # --- create / fork -------------------------------------------------------------

    def create(
        self,
        owner_uid: int,
        owner_gid: int,
        workspace: str,
        base: str | None = None,
        clock_offset_sec: int = 0,
        env_whitelist: list[str] | None = None,
        limits: dict[str, int] | None = None,
        network: str = "none",
    ) -> dict[str, Any]:
        """Mount a capsule over ``workspace`` (or over ``base``, shown at the workspace's path)."""
        _check_uid_gid(owner_uid, owner_gid)
        workspace = self._check_dir_arg("workspace", workspace)
        if base is not None:
            base = self._check_dir_arg("base", base, allow_state=True)
        _check_int("clock_offset_sec", clock_offset_sec, -MAX_CLOCK_OFFSET_SEC, MAX_CLOCK_OFFSET_SEC)
        whitelist = _check_env_whitelist(env_whitelist)
        limits = _check_limits(limits)
        disk_mb = self._disk_size(limits.pop("disk_mb", None))
        if network not in NETWORKS:
            raise CcwError("INVALID_ARGUMENT", f"network must be one of {list(NETWORKS)}, not {network!r:.40}")
        # With a base, the workspace is only where the jail shows it: a replay on another
        # machine, or after the workspace was deleted, has no directory there.  Nothing
        # is written at that path on the host, so there is nothing to check access to.
        ws_fd = None if base is not None and not os.path.lexists(workspace) else _open_dir(workspace, "workspace")
        base_fd = _open_dir(base, "base") if base is not None else None
        try:
            if ws_fd is not None:
                _check_access(ws_fd, workspace, owner_uid, owner_gid, os.W_OK | os.X_OK, "write")
                # Check the resolved path again: a symlink in the argument may lead elsewhere.
                self._check_resolved("workspace", os.readlink(f"/proc/self/fd/{ws_fd}"), allow_state=False)
            if base_fd is not None:
                _check_access(base_fd, base or "", owner_uid, owner_gid, os.R_OK | os.X_OK, "read")
            lower_fd = base_fd if base_fd is not None else ws_fd
            assert lower_fd is not None
            lower_real = os.readlink(f"/proc/self/fd/{lower_fd}")
            self._check_resolved("base" if base is not None else "workspace", lower_real, allow_state=base is not None)
            meta = {
                "version": _META_VERSION,
                "owner_uid": owner_uid,
                "owner_gid": owner_gid,
                "workspace": workspace,
                "base": base,
                "lowers": [lower_real],
                "ancestors": [],
                "parent": None,
                "clock_offset_sec": clock_offset_sec,
                "env_whitelist": whitelist,
                "limits": limits,
                "network": network,
                "disk_mb": disk_mb,
            }
            st = os.fstat(lower_fd)
            capsule = self._materialise(meta, st, mount_lowers=[f"/proc/self/fd/{lower_fd}"])
        finally:
            if ws_fd is not None:
                os.close(ws_fd)
            if base_fd is not None:
                os.close(base_fd)
        return self._describe(capsule)

    def _disk_size(self, requested: int | None) -> int | None:
        """The disk size for a new capsule: the request, else the default; None for no disk."""
        if self.disks is None:
            if requested is not None:
                raise CcwError("UNSUPPORTED", f"this helper cannot give capsules a disk limit: {self.disk_reason}; "
                               "create the capsule without limits.disk_mb")
            return None
        return requested if requested is not None else self.disks.default_mb

    def fork(self, capsule_id: str, caller_uid: int, caller_gid: int) -> dict[str, Any]:
        """A child capsule seeing its parent's view; the parent is frozen while it exists."""
        _check_uid_gid(caller_uid, caller_gid)
        parent = self._get(capsule_id, caller_uid)
        if any(_inside(parent.root, lower) for lower in parent.base_lowers):
            # overlayfs refuses (ELOOP) a lower layer that lies inside another lower layer.
            raise CcwError("UNSUPPORTED", f"capsule {capsule_id} cannot be forked: the helper's state dir "
                           f"{self.state_dir!r} lies inside its workspace; run the helper with a state dir "
                           "outside the workspace (CCW_STATE_DIR)")
        if len(parent.ancestors) + 1 >= MAX_FORK_DEPTH:
            raise CcwError("TOO_LARGE", f"forks nest at most {MAX_FORK_DEPTH} deep; fork an earlier capsule")
        with self._lock:
            if parent.busy:
                raise CcwError("CONFLICT", f"capsule {capsule_id} is running a command; fork it when that ends")
            self._ensure_mounted(parent)
            if not parent.children:
                overlay.set_readonly(parent.path("merged"), True)
            parent.children.add("")  # reserve: keeps the parent frozen while the child is built
        child: Capsule | None = None
        try:
            meta = dict(parent.meta)
            meta.update(
                lowers=[parent.path("upper"), *parent.lowers],
                ancestors=[parent.capsule_id, *parent.ancestors],
                parent=parent.capsule_id,
                disk_mb=self._disk_size(parent.disk_mb),
            )
            st = os.stat(parent.path("merged"))
            child = self._materialise(meta, st, mount_lowers=meta["lowers"])
        finally:
            with self._lock:
                parent.children.discard("")
                if child is not None:
                    parent.children.add(child.capsule_id)
                elif not parent.children:
                    overlay.set_readonly(parent.path("merged"), False)
        result = self._describe(child)
        result["parent"] = parent.capsule_id
        return result

    def _materialise(self, meta: dict[str, Any], root_st: os.stat_result, mount_lowers: list[str]) -> Capsule:
        """Build ``.new-<id>``, rename it into place, mount it.  O(1) in the workspace."""
        capsule_id = self._new_id()
        meta = dict(meta, capsule_id=capsule_id, created_at=_now_iso())
        building = os.path.join(self.capsules_dir, f".new-{capsule_id}")
        final = os.path.join(self.capsules_dir, capsule_id)
        data = building  # where upper, work, tmp and home go
        try:
            os.mkdir(building, 0o700)
            os.mkdir(os.path.join(building, "merged"), 0o755)
            if meta["disk_mb"] is not None:
                assert self.disks is not None
                data = os.path.join(building, "disk")
                os.mkdir(data, 0o700)
                mount_fd = self.disks.take(meta["disk_mb"], os.path.join(building, "disk.img"))
                try:
                    disk.attach(mount_fd, data)
                finally:
                    os.close(mount_fd)
                self.disks.start()
            else:
                for name, mode in disk.LAYOUT:
                    os.mkdir(os.path.join(data, name))
                    os.chmod(os.path.join(data, name), mode)
            os.chown(os.path.join(data, "home"), meta["owner_uid"], meta["owner_gid"])
            upper = os.path.join(data, "upper")
            # Rootless: a workspace owned by an unmapped uid shows as the overflow uid,
            # which cannot be chowned to; the merged root then shows as the helper's.
            with contextlib.suppress(OSError) if self.rootless else contextlib.nullcontext():
                os.chown(upper, root_st.st_uid, root_st.st_gid)
            os.chmod(upper, stat.S_IMODE(root_st.st_mode))
            _write_json(os.path.join(building, "meta.json"), meta)
            os.rename(building, final)
        except BaseException as exc:
            for point in overlay.mounts_under(building):
                overlay.teardown(point)
            shutil.rmtree(building, ignore_errors=True)
            if isinstance(exc, OSError):
                raise from_oserror(exc, "create capsule dirs", building, "check the state dir's space and permissions") from exc
            raise
        capsule = Capsule(capsule_id, final, meta, disk_ready=meta["disk_mb"] is not None)
        try:
            overlay.prepare(mount_lowers, capsule.path("upper"), capsule.path("work"), capsule.path("merged"), self.rootless)
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
        capsule.mounted = True
        with self._lock:
            self._capsules[capsule_id] = capsule
        return capsule

    def _describe(self, capsule: Capsule) -> dict[str, Any]:
        meta = capsule.meta
        return {
            "capsule_id": capsule.capsule_id,
            "mount": capsule.path("merged"),
            "workspace": meta["workspace"],
            "created_at": meta["created_at"],
            "clock": _now_iso(meta["clock_offset_sec"]),
            "isolation": self.isolation(meta),
        }

    def isolation(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The mechanisms in force for a capsule (helper-wide ones probed once)."""
        if self._isolation is None:
            probes: dict[str, Any] = {}
            for name in ("jail", "cgroups", "fanotify"):
                try:
                    module = __import__(f"sandbox.{name}", fromlist=["mechanisms"])
                    probes[name] = module.mechanisms()
                except Exception as exc:  # a missing or failing probe is reported, not fatal
                    probes[name] = {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
            self._isolation = probes
        filesystem: dict[str, Any] = {"overlayfs": True, "userxattr": self.rootless, "frozen_base": meta["base"] is not None,
                                      "disk_limit_mb": meta.get("disk_mb")}
        if meta.get("disk_mb") is None:
            filesystem["disk_limit_unavailable"] = self.disk_reason or "the capsule was made without a disk"
        return {
            "filesystem": filesystem,
            "network": meta["network"],
            "clock_offset_sec": meta["clock_offset_sec"],
            **self._isolation,
        }

    # --- mounting on demand --------------------------------------------------------

    def _ensure_mounted(self, capsule: Capsule) -> None:
        """Mount a capsule recovered from disk (parents first); call with the lock held."""
        if capsule.mounted:
            return
        self._ensure_disks(capsule)
        overlay.prepare(capsule.lowers, capsule.path("upper"), capsule.path("work"), capsule.path("merged"), self.rootless)
        capsule.mounted = True
        if capsule.children:
            overlay.set_readonly(capsule.path("merged"), True)

    def _ensure_disks(self, capsule: Capsule) -> None:
        """Mount the disks of a capsule and of its ancestors (their uppers are its lowers)."""
        for one in (capsule, *(self._capsules[a] for a in capsule.ancestors if a in self._capsules)):
            if one.disk_ready or one.disk_mb is None:
                continue
            target = one.path("disk")
            if not os.path.ismount(target):
                mount_fd = disk.mount_image(one.path("disk.img"))
                try:
                    disk.attach(mount_fd, target)
                finally:
                    os.close(mount_fd)
            _make_private_dirs(target, one.meta["owner_uid"], one.meta["owner_gid"], exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(one.path("work"), 0o700)
            one.disk_ready = True

    # --- queries -------------------------------------------------------------------

    def changes(self, capsule_id: str, caller_uid: int) -> dict[str, Any]:
        """The capsule's changes against its base, sorted by path (see overlay.collect_changes)."""
        capsule = self._get(capsule_id, caller_uid)
        with self._lock:
            self._ensure_disks(capsule)
        uppers = [capsule.path("upper"), *capsule.lowers[: len(capsule.ancestors)]]
        found = overlay.collect_changes(uppers, capsule.base_lowers)
        return {"changes": [change.to_dict() for change in found]}

    def open_root(self, capsule_id: str, caller_uid: int) -> int:
        """An O_PATH|O_DIRECTORY descriptor of the merged view; the caller closes it."""
        capsule = self._get(capsule_id, caller_uid)
        with self._lock:
            self._ensure_mounted(capsule)
        merged = capsule.path("merged")
        fd = os.open(merged, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        if os.fstat(fd).st_dev == os.stat(capsule.root).st_dev:
            os.close(fd)
            raise CcwError("INTERNAL", f"capsule {capsule_id}'s overlay is not mounted; destroy and recreate it")
        return fd

    def list(self, caller_uid: int) -> dict[str, Any]:
        """The caller's own capsules, sorted by id (= creation)."""
        with self._lock:
            own = [c.summary() for c in self._capsules.values() if c.meta["owner_uid"] == caller_uid]
        return {"capsules": sorted(own, key=lambda c: c["capsule_id"])}

    # --- destroy / recover ---------------------------------------------------------

    def destroy(self, capsule_id: str, caller_uid: int) -> dict[str, Any]:
        """Unmount (lazily if busy) and delete a capsule without forks."""
        capsule = self._get(capsule_id, caller_uid)
        with self._lock:
            if capsule.children:
                forks = sorted(c for c in capsule.children if c)
                raise CcwError("CONFLICT", f"capsule {capsule_id} has forks {forks}; destroy them first",
                               {"forks": forks})
            if capsule.busy:
                raise CcwError("CONFLICT", f"capsule {capsule_id} is running a command; destroy it when that ends")
            self._capsules.pop(capsule_id, None)
            parent = self._capsules.get(capsule.meta["parent"] or "")
        self._remove_dir(capsule.root, capsule_id)
        if parent is not None:
            with self._lock:
                parent.children.discard(capsule_id)
                if not parent.children and parent.mounted:
                    overlay.set_readonly(parent.path("merged"), False)
        return {"capsule_id": capsule_id, "destroyed": True}

    def _remove_dir(self, root: str, capsule_id: str) -> None:
        # The overlay first: its upper dir lives on the disk mounted beside it.
        merged = os.path.join(root, "merged")
        for point in sorted(overlay.mounts_under(root), key=lambda p: p != merged):
            overlay.teardown(point)
        dead = os.path.join(self.capsules_dir, f".dead-{capsule_id}")
        try:
            os.rename(root, dead)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise from_oserror(exc, "rename capsule dir", root) from exc
        shutil.rmtree(dead)

    def recover(self) -> dict[str, Any]:
        """At start: detach stale mounts, delete half-made capsules, re-register the rest.

        Also starts filling the disk pool.
        """
        for point in overlay.mounts_under(self.capsules_dir):
            log.info("detaching stale mount %s", point)
            overlay.teardown(point)
        removed: list[str] = []
        found: dict[str, Capsule] = {}
        for name in sorted(os.listdir(self.capsules_dir)):  # parents sort before their forks
            root = os.path.join(self.capsules_dir, name)
            if name.startswith((".new-", ".dead-")):
                shutil.rmtree(root, ignore_errors=True)
                removed.append(name)
                continue
            if not ID_RE.fullmatch(name):
                continue  # not ours
            meta, why = _load_meta(root, name)
            if meta is not None and meta["parent"] is not None and meta["parent"] not in found:
                why = f"its parent {meta['parent']} is gone"
                meta = None
            if meta is None:
                log.warning("removing capsule %s: %s", name, why)
                self._remove_dir(root, name)
                removed.append(name)
                continue
            capsule = Capsule(name, root, meta)
            if capsule.disk_mb is None:  # a capsule with a disk gets these when it is mounted
                _make_private_dirs(root, meta["owner_uid"], meta["owner_gid"], exist_ok=True)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(capsule.path("work"), 0o700)
            with contextlib.suppress(FileExistsError):
                os.mkdir(capsule.path("merged"), 0o755)
            found[name] = capsule
        for capsule in found.values():
            parent = found.get(capsule.meta["parent"] or "")
            if parent is not None:
                parent.children.add(capsule.capsule_id)
        with self._lock:
            self._capsules = found
        stale_cgroups = _cleanup_stale_cgroups()
        if self.disks is not None:
            self.disks.start()  # so that the first create finds a disk ready
        return {"capsules": sorted(found), "removed": removed, "cgroups_removed": stale_cgroups}

    # --- argument checks that need the manager ---------------------------------------

    def _check_dir_arg(self, name: str, value: Any, allow_state: bool = False) -> str:
        if not isinstance(value, str) or not value.startswith("/") or "\0" in value or len(value) > 4096:
            raise CcwError("INVALID_ARGUMENT", f"{name} must be an absolute path without NUL, got {value!r:.80}")
        path = os.path.normpath(value)
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        self._check_resolved(name, path, allow_state)
        return path

    def _check_resolved(self, name: str, path: str, allow_state: bool) -> None:
        if path == "/":
            raise CcwError("INVALID_ARGUMENT", f"{name} may not be / itself; pass the project's directory")
        forbidden = self.capsules_dir if allow_state else self.state_dir
        if _inside(path, forbidden):
            raise CcwError(
                "INVALID_ARGUMENT",
                f"{name} {path!r} lies inside the helper's state dir {forbidden!r}; use a directory outside it",
            )

    # --- exec ------------------------------------------------------------------------

    def exec(
        self,
        capsule_id: str,
        caller_uid: int,
        caller_gid: int,
        argv: _Argv,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        limits: dict[str, int] | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        progress_ms: int = 1000,
    ) -> dict[str, Any]:
        """Run ``argv`` in a fresh jail over the capsule; output, usage and touched files.

        ``on_progress`` receives the jail's progress reports (elapsed time, byte counts,
        output tails) about every ``progress_ms`` while the command runs.
        """
        _check_uid_gid(caller_uid, caller_gid)
        capsule = self._get(capsule_id, caller_uid)
        _check_argv(argv)
        _check_int("timeout_ms", timeout_ms, 1, MAX_TIMEOUT_MS)
        _check_int("output_cap", output_cap, 0, MAX_OUTPUT_CAP)
        if stdin is not None and (not isinstance(stdin, bytes) or len(stdin) > MAX_STDIN):
            raise CcwError("INVALID_ARGUMENT", f"stdin must be at most {MAX_STDIN} bytes")
        meta = capsule.meta
        final_env = _final_env(env, meta["env_whitelist"])
        workdir = _resolve_cwd(cwd, meta["workspace"])
        # Per-exec limits may only tighten the capsule's own.
        exec_limits = dict(meta["limits"])
        for key, value in _check_limits(limits).items():
            if key != "disk_mb":  # the disk's size is the capsule's, fixed when it was made
                exec_limits[key] = min(value, exec_limits.get(key, value))
        with self._lock:
            if capsule.children:
                forks = sorted(c for c in capsule.children if c)
                raise CcwError("CONFLICT", f"capsule {capsule_id} is frozen while it has forks {forks}; "
                               "exec in a fork, or destroy the forks first", {"forks": forks})
            if capsule.busy:
                raise CcwError("CONFLICT", f"capsule {capsule_id} is already running a command; wait for it")
            self._ensure_mounted(capsule)
            capsule.busy = True
            self._exec_count += 1
            exec_name = f"{capsule_id}.{self._exec_count}"
        try:
            return self._run(capsule, exec_name, argv, workdir, final_env, stdin, timeout_ms, exec_limits,
                             output_cap, caller_uid, caller_gid, on_progress, progress_ms)
        finally:
            with self._lock:
                capsule.busy = False

    def _run(self, capsule: Capsule, exec_name: str, argv: _Argv, cwd: str, env: dict[str, str],
             stdin: bytes | None, timeout_ms: int, limits: dict[str, int], output_cap: int,
             uid: int, gid: int, on_progress: Callable[[dict[str, Any]], None] | None = None,
             progress_ms: int = 1000) -> dict[str, Any]:
        """prepare cgroup → prepare+enter tracer → jail.run → collect → teardown (always)."""
        from sandbox import cgroups, fanotify, jail, rusage

        merged, upper = capsule.path("merged"), capsule.path("upper")
        spec = jail.JailSpec(
            merged_dir=merged, workspace=capsule.meta["workspace"], tmp_dir=capsule.path("tmp"),
            home_dir=capsule.path("home"), argv=list(argv), cwd=cwd, env=env, stdin=stdin,
            timeout_ms=timeout_ms, output_cap=output_cap, uid=uid, gid=gid,
            clock_offset_sec=capsule.meta["clock_offset_sec"], network=capsule.meta["network"],
        )
        cg_limits = cgroups.Limits(
            memory_bytes=limits["memory_mb"] << 20 if "memory_mb" in limits else None,
            pids_max=limits.get("pids_max"), cpu_ms=limits.get("cpu_ms"),
        )
        before = overlay.upper_signature(upper)
        cgroup = None
        tracer = None
        trace_error: str | None = None
        try:
            cgroup = cgroups.ExecCgroup.prepare(_layout(), exec_name.replace(".", "-"), cg_limits)
            try:
                tracer = fanotify.Tracer.prepare(merged)
                tracer.enter(cgroup, visible_at=capsule.meta["workspace"])
            except CcwError as exc:
                trace_error = exc.message
                if tracer is not None:
                    tracer.teardown()
                    tracer = None
            result = jail.run(spec, cgroup, on_progress=on_progress, progress_interval_s=progress_ms / 1000)
            touched = tracer.collect() if tracer is not None else None
            # Only the init's report: the helper's own wait4 misses what a kill ended (rusage.py).
            usage = cgroup.collect(result.init_report)
            rusage.fill(usage, result.init_report)
        finally:
            if tracer is not None:
                tracer.teardown()
            if cgroup is not None:
                cgroup.teardown()
        after = overlay.upper_signature(upper)
        moved = _upper_diff(before, after, capsule.lowers)
        disk_report: dict[str, Any] | None = None
        if capsule.disk_mb is not None:
            disk_report = {"limit_mb": capsule.disk_mb, **disk.usage(upper)}
            disk_report["full"] = disk_report["free_kb"] < max(DISK_FULL_MIN_KB, capsule.disk_mb * 1024 // 100)
        touched_unavailable: dict[str, str] = {}
        listed: list[str] | None = None  # directories opened and files executed: known when read is
        executed: list[str] | None = None
        if touched is None:
            read: list[str] | None = None
            written = moved
            touched_unavailable["read"] = trace_error or "no tracer"
        else:
            read, listed, executed = touched.read, touched.listed, touched.executed
            written = sorted(set(touched.written) | set(moved), key=os.fsencode)
            if touched.overflow:
                read = listed = executed = None
                touched_unavailable["read"] = "the fanotify queue overflowed; the read set is incomplete"
            elif read is None:
                touched_unavailable["read"] = touched.unavailable_reason or "not recorded"
        return {
            "exit_code": result.exit_code,
            "signal": result.signal,
            "timed_out": result.timed_out,
            "oom_killed": usage.oom_killed,
            "duration_ms": result.duration_ms,
            "stdout_b64": base64.b64encode(result.stdout).decode(),
            "stderr_b64": base64.b64encode(result.stderr).decode(),
            "stdout_bytes": result.stdout_bytes,
            "stderr_bytes": result.stderr_bytes,
            "truncated": {"stdout": result.stdout_truncated, "stderr": result.stderr_truncated},
            "usage": {"cpu_ms": usage.cpu_ms, "rss_max_kb": usage.rss_max_kb,
                      "rss_max_process_kb": usage.rss_max_process_kb,
                      "io_read_kb": usage.io_read_kb, "io_write_kb": usage.io_write_kb},
            "usage_unavailable": dict(usage.unavailable),
            "usage_sources": dict(usage.sources),
            "disk": disk_report,
            "touched": {"read": read, "written": written, "listed": listed, "executed": executed},
            "touched_unavailable": touched_unavailable,
        }


# --- module helpers ----------------------------------------------------------------------

_LAYOUT: Any = None


def _layout() -> Any:
    global _LAYOUT
    if _LAYOUT is None:
        from sandbox import cgroups

        _LAYOUT = cgroups.detect_layout()
    return _LAYOUT


def _cleanup_stale_cgroups() -> list[str]:
    try:
        from sandbox import cgroups

        return list(cgroups.cleanup_stale())
    except Exception as exc:  # recovery of cgroups must not keep capsules from being served
        log.warning("cleaning stale cgroups failed: %s", exc)
        return []


def _upper_diff(before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]], lowers: list[str]) -> list[str]:
    """Paths an exec created, deleted, renamed or rewrote, per two upper-dir signatures.

    A directory that merely appeared because something below it was copied up is not a
    creation (it exists in a lower layer and is not opaque), so it is left out.
    """
    paths = []
    for path in set(before) | set(after):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        if (old is None and new is not None and new[0] == stat.S_IFDIR and not new[2]
                and overlay.lower_lookup(lowers, path) is not None):
            continue
        paths.append(path)
    return sorted(paths, key=os.fsencode)


def _inside(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/")


def _check_uid_gid(uid: Any, gid: Any) -> None:
    for name, value in (("uid", uid), ("gid", gid)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32 - 1:
            raise CcwError("INVALID_ARGUMENT", f"{name} must be an integer in [0, 2**32-1), got {value!r:.40}")


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise CcwError("INVALID_ARGUMENT", f"{name} must be an integer in [{low}, {high}], got {value!r:.40}")


def _check_env_whitelist(names: Any) -> list[str]:
    if names is None:
        return []
    if not isinstance(names, list) or len(names) > 1024:
        raise CcwError("INVALID_ARGUMENT", "env_whitelist must be a list of at most 1024 variable names")
    for item in names:
        if not isinstance(item, str) or not ENV_NAME_RE.fullmatch(item):
            raise CcwError("INVALID_ARGUMENT", f"env_whitelist entry {item!r:.80} is not a variable name")
    return sorted(set(names))


def _check_limits(limits: Any) -> dict[str, int]:
    if limits is None:
        return {}
    if not isinstance(limits, dict) or not set(limits) <= set(_LIMIT_KEYS):
        raise CcwError("INVALID_ARGUMENT", f"limits must be an object with keys among {list(_LIMIT_KEYS)}")
    bounds = {"memory_mb": (1, 1 << 20), "pids_max": (1, 1 << 22), "cpu_ms": (1, MAX_TIMEOUT_MS),
              "disk_mb": (DISK_MB_MIN, DISK_MB_MAX)}
    for key, value in limits.items():
        _check_int(f"limits.{key}", value, *bounds[key])
    return dict(limits)


def _check_argv(argv: Any) -> None:
    if not isinstance(argv, list) or not argv:
        raise CcwError("INVALID_ARGUMENT", "argv must be a non-empty list of strings")
    total = 0
    for item in argv:
        if not isinstance(item, str) or "\0" in item:
            raise CcwError("INVALID_ARGUMENT", f"argv entry {item!r:.80} must be a string without NUL")
        total += len(item.encode(errors="surrogateescape")) + 1
    if total > MAX_ARG_BYTES:
        raise CcwError("TOO_LARGE", f"argv is {total} bytes, over {MAX_ARG_BYTES}; pass data through stdin or a file")


def _final_env(env: Any, whitelist: list[str]) -> dict[str, str]:
    """The given variables (each must be whitelisted) over PATH/HOME/LANG defaults."""
    env = {} if env is None else env
    if not isinstance(env, dict):
        raise CcwError("INVALID_ARGUMENT", "env must be an object of strings")
    allowed = ALWAYS_ALLOWED_ENV | set(whitelist)
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME_RE.fullmatch(key):
            raise CcwError("INVALID_ARGUMENT", f"env name {key!r:.80} is not a variable name")
        if not isinstance(value, str) or "\0" in value:
            raise CcwError("INVALID_ARGUMENT", f"env value of {key} must be a string without NUL")
        if key not in allowed:
            raise CcwError("INVALID_ARGUMENT",
                           f"env variable {key} is not in the capsule's env_whitelist {sorted(allowed)}; "
                           "create the capsule with it whitelisted", {"name": key})
    return {"PATH": DEFAULT_PATH, "HOME": DEFAULT_HOME, "LANG": DEFAULT_LANG, **env}


def _resolve_cwd(cwd: Any, workspace: str) -> str:
    """None → the workspace; relative → under the workspace (no escaping it); absolute as is."""
    if cwd is None:
        return workspace
    if not isinstance(cwd, str) or "\0" in cwd or not cwd or len(cwd) > 4096:
        raise CcwError("INVALID_ARGUMENT", f"cwd must be a path without NUL, got {cwd!r:.80}")
    if cwd.startswith("/"):
        return os.path.normpath(cwd)
    joined = os.path.normpath(os.path.join(workspace, cwd))
    if not _inside(joined, workspace):
        raise CcwError("INVALID_ARGUMENT", f"cwd {cwd!r} leaves the workspace; pass an absolute path instead")
    return joined


def _open_dir(path: str, name: str) -> int:
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
        raise CcwError("PERMISSION_DENIED", f"uid {uid} may not {verb} {path!r}; a capsule may only be "
                       f"created over a directory you can {verb}", {"path": path})


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


def _make_private_dirs(root: str, uid: int, gid: int, exist_ok: bool = False) -> None:
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


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as file:
        json.dump(data, file, sort_keys=True)
    os.rename(tmp, path)


def _load_meta(root: str, capsule_id: str) -> tuple[dict[str, Any] | None, str]:
    """meta.json if it is valid and the upper dir holds the data, else (None, why)."""
    try:
        with open(os.path.join(root, "meta.json"), encoding="utf-8") as file:
            meta = json.load(file)
    except (OSError, ValueError) as exc:
        return None, f"meta.json unreadable: {exc}"
    expected = {"owner_uid": int, "owner_gid": int, "workspace": str, "lowers": list, "ancestors": list,
                "clock_offset_sec": int, "env_whitelist": list, "limits": dict, "network": str, "created_at": str}
    if not isinstance(meta, dict) or meta.get("capsule_id") != capsule_id or meta.get("version") != _META_VERSION:
        return None, "meta.json is not this capsule's"
    for key, kind in expected.items():
        if not isinstance(meta.get(key), kind):
            return None, f"meta.json field {key} is missing or not a {kind.__name__}"
    if not meta["lowers"] or not all(isinstance(p, str) and p.startswith("/") for p in meta["lowers"]):
        return None, "meta.json lowers are not absolute paths"
    if len(meta["ancestors"]) >= len(meta["lowers"]):
        return None, "meta.json has more ancestors than lower layers"
    if (meta.get("parent") or None) != (meta["ancestors"][0] if meta["ancestors"] else None):
        return None, "meta.json parent and ancestors disagree"
    disk_mb = meta.get("disk_mb")
    if disk_mb is not None and (not isinstance(disk_mb, int) or isinstance(disk_mb, bool)):
        return None, "meta.json disk_mb is not an integer"
    if disk_mb is not None:
        if not os.path.isfile(os.path.join(root, "disk.img")):
            return None, "the disk image holding the upper dir is gone"
    elif not os.path.isdir(os.path.join(root, "upper")):
        return None, "the upper dir is gone"
    return meta, ""
