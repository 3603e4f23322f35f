"""``ccw doctor``: which kernel features work *here*, each probed for real.

Nothing is guessed from version numbers: every probe does the thing ccw does, in a
forked child so that a namespace or mount it makes dies with it, and reports what
happened.  Some facts the probes follow from:

- A helper running as root (``--privileged``) creates the jail's namespaces directly.
  An unprivileged helper (``--rootless``) first becomes root of a user namespace, and
  creates the others *inside* it; so, run unprivileged, each namespace probe enters a
  user namespace first, as the rootless helper would.
- Unprivileged user namespaces can be switched off in four places: the kernel config,
  Debian's ``kernel.unprivileged_userns_clone``, ``user.max_user_namespaces`` and
  Ubuntu's AppArmor ``kernel.apparmor_restrict_unprivileged_userns``.  The fix names
  whichever of these is set against us.
- overlayfs in a user namespace needs ``userxattr`` (5.11+) and an upper filesystem
  that stores ``user.*`` xattrs; the probe mounts one in the state dir (where capsules
  live) when it exists, with the same options the helper uses (``overlay.prepare``).
- fanotify ``FAN_MARK_FILESYSTEM`` needs CAP_SYS_ADMIN in the *initial* user namespace:
  a rootless helper can never have it, so rootless capsules report ``touched.read``
  as null.  The probe marks a real overlay and sees a real open.
- cgroup limits need a hierarchy the helper may create cgroups in: as root, any
  mounted one; unprivileged, only a delegated cgroup v2 subtree.  Without one,
  capsules still run, without limits and without the total memory of an exec (null);
  CPU time and the largest single process come from the jail init's rusage.
- The seccomp probe installs ccw's own jail filter (``sandbox.seccomp``) in a child and
  checks that a denied call (``keyctl``) fails with EPERM.
- Landlock and bubblewrap are informational: ccw uses neither, but they tell a user
  what else the machine offers.

``run()`` returns the report (JSON-ready); ``render()`` makes the table.  Capsules can
run when the helper can run in some mode: privileged (root: mount, pid, net, uts,
ipc, cgroup namespaces and overlayfs), rootless (user namespace + the same inside it),
or through a reachable system helper service (``CCW_HELPER_SOCKET``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import pwd
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from sandbox import syscalls

PROBE_TIMEOUT_S = 15.0
SERVICE_SOCKET = "/run/ccw/helper.sock"
NAMESPACE_FLAGS = {
    "mount": syscalls.CLONE_NEWNS,
    "pid": syscalls.CLONE_NEWPID,
    "net": syscalls.CLONE_NEWNET,
    "uts": syscalls.CLONE_NEWUTS,
    "ipc": syscalls.CLONE_NEWIPC,
    "cgroup": syscalls.CLONE_NEWCGROUP,
    "user": syscalls.CLONE_NEWUSER,
    "time": syscalls.CLONE_NEWTIME,
}
# What every jail needs (sandbox/namespaces.py JAIL_NAMESPACES); time only for clock offsets.
JAIL_NAMESPACES = ("mount", "pid", "net", "uts", "ipc", "cgroup")
FIX_ROOT = "run as root, or install the ccw-helper service (deploy/) and join group ccw"
LANDLOCK_CREATE_RULESET = 444  # the same number on x86_64 and aarch64 (unified table)
LANDLOCK_CREATE_RULESET_VERSION = 1


@dataclass
class Check:
    """One probed feature: whether it works here, what was seen, and how to fix it."""

    name: str
    ok: bool | None  # None: not applicable or informational only
    detail: str
    fix: str | None = None
    required_for: str = ""  # which mode needs it: "privileged", "rootless", "both", "" (optional)


# --------------------------------------------------------------------- child probes
def _in_child(probe: Callable[[], str]) -> tuple[bool, str]:
    """Run ``probe`` in a forked child; (True, its detail) or (False, the error it raised)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        os.close(read_fd)
        status = 0
        try:
            message = {"ok": True, "detail": probe()}
        except BaseException as exc:
            message = {"ok": False, "detail": _describe(exc)}
            status = 1
        try:
            os.write(write_fd, json.dumps(message).encode())
        finally:
            os._exit(status)
    os.close(write_fd)
    chunks = []
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([read_fd], [], [], max(left, 0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                return False, f"the probe did not finish within {PROBE_TIMEOUT_S:g} s"
            data = os.read(read_fd, 65536)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
    try:
        message = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return False, "the probe died without a report"
    return bool(message.get("ok")), str(message.get("detail", "the probe died without a report"))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        text = str(exc.strerror or exc)
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        return text if name in text else f"{text} ({name})"
    message = getattr(exc, "message", None)
    return str(message or exc) or type(exc).__name__


def _enter_user_namespace() -> None:
    """Become root of a new user namespace mapping our own ids (what the rootless helper does)."""
    uid, gid = os.getuid(), os.getgid()
    syscalls.unshare(syscalls.CLONE_NEWUSER)
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _private_mount_namespace(rootless: bool) -> None:
    if rootless:
        _enter_user_namespace()
    syscalls.unshare(syscalls.CLONE_NEWNS)
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)


def _probe_namespace(name: str, rootless: bool) -> Callable[[], str]:
    def probe() -> str:
        if name == "user":
            _enter_user_namespace()
            return "unshare(CLONE_NEWUSER) and uid/gid maps written"
        if rootless:
            _enter_user_namespace()
        syscalls.unshare(NAMESPACE_FLAGS[name])
        where = " inside a user namespace" if rootless else ""
        if name == "pid":  # the *next* child is pid 1 of the new namespace
            child = os.fork()
            if child == 0:
                os._exit(0 if os.getpid() == 1 else 3)
            _, status = os.waitpid(child, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError("the first child of a new pid namespace is not pid 1")
            return f"unshare(CLONE_NEWPID){where}; first child is pid 1"
        return f"unshare(CLONE_NEW{name.upper() if name != 'mount' else 'NS'}){where}"

    return probe


def _make_layers(base: str) -> tuple[str, str, str, str]:
    dirs = tuple(os.path.join(base, d) for d in ("lower", "upper", "work", "merged"))
    for d in dirs:
        os.mkdir(d)
    with open(os.path.join(dirs[0], "seen"), "w") as f:
        f.write("lower\n")
    return dirs  # type: ignore[return-value]


def _probe_overlay(base: str, rootless: bool) -> Callable[[], str]:
    def probe() -> str:
        from sandbox import overlay

        lower, upper, work, merged = _make_layers(base)
        _private_mount_namespace(rootless)
        overlay.prepare([lower], upper, work, merged, userxattr=rootless)
        try:
            with open(os.path.join(merged, "written"), "w") as f:
                f.write("upper\n")
            os.unlink(os.path.join(merged, "seen"))
            if not os.path.exists(os.path.join(upper, "written")):
                raise RuntimeError("a write through the overlay did not reach the upper dir")
            if not overlay.is_whiteout(os.lstat(os.path.join(upper, "seen"))):
                raise RuntimeError("deleting a lower file left no whiteout in the upper dir")
        finally:
            overlay.teardown(merged)
        options = "userxattr, in a user namespace" if rootless else "trusted xattrs"
        return f"mounted on {_filesystem_of(base)} ({options}); copy-up and whiteouts work"

    return probe


def _probe_fanotify(base: str) -> Callable[[], str]:
    def probe() -> str:
        from sandbox import overlay

        lower, upper, work, merged = _make_layers(base)
        _private_mount_namespace(rootless=False)
        overlay.prepare([lower], upper, work, merged, userxattr=False)
        fd = syscalls.fanotify_init(syscalls.FAN_CLASS_NOTIF | syscalls.FAN_CLOEXEC, os.O_RDONLY)
        try:
            syscalls.fanotify_mark(fd, syscalls.FAN_MARK_ADD | syscalls.FAN_MARK_FILESYSTEM,
                                   syscalls.FAN_OPEN, syscalls.AT_FDCWD, merged)
            with open(os.path.join(merged, "seen")) as f:
                f.read()
            ready, _, _ = select.select([fd], [], [], 5.0)
            if not ready:
                raise RuntimeError("FAN_MARK_FILESYSTEM on an overlay saw no open event")
        finally:
            os.close(fd)
            overlay.teardown(merged)
        return "FAN_MARK_FILESYSTEM on an overlay sees opens (touched.read recorded)"

    return probe


def _probe_disk(base: str) -> Callable[[], str]:
    def probe() -> str:
        from sandbox import disk, overlay

        reason = disk.unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        _private_mount_namespace(rootless=False)
        image, target = os.path.join(base, "disk.img"), os.path.join(base, "disk")
        os.mkdir(target)
        disk.format_image(image, disk.MIN_MB)
        mount_fd = disk.mount_image(image)
        try:
            disk.attach(mount_fd, target)
        finally:
            os.close(mount_fd)
        try:
            os.mkdir(os.path.join(target, "upper"))
            free_mb = disk.usage(target)["free_kb"] // 1024
        finally:
            overlay.teardown(target)
        return (f"a {disk.MIN_MB} MiB ext4 image mounts on a loop device ({free_mb} MiB free for files): "
                f"each capsule's writes are limited to CCW_CAPSULE_DISK_MB (default {disk.DEFAULT_MB} MiB)")

    return probe


def _probe_seccomp() -> str:
    import prctl

    from sandbox import seccomp

    prepared = seccomp.prepare()
    if prepared is None:
        raise RuntimeError(f"ccw has no seccomp filter for {platform.machine()}")
    prctl.set_no_new_privs(1)
    seccomp.enter(prepared)
    number = seccomp.syscall_number("keyctl", platform.machine())
    libc = ctypes.CDLL(None, use_errno=True)
    if number is not None and libc.syscall(number, 0, 0, 0, 0, 0) == -1 and ctypes.get_errno() != errno.EPERM:
        raise RuntimeError(f"keyctl failed with {errno.errorcode.get(ctypes.get_errno())}, not EPERM")
    with open("/proc/self/status") as f:
        mode = next((line.split()[1] for line in f if line.startswith("Seccomp:")), "?")
    if mode != "2":
        raise RuntimeError(f"/proc/self/status says Seccomp: {mode} after installing the filter")
    return f"ccw's filter ({prepared.length} instructions) installed; keyctl denied with EPERM"


# --------------------------------------------------------------------- in-process probes
def _filesystem_of(path: str) -> str:
    best, fstype = "", "?"
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4]
            sep = fields.index("-")
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, fstype = point, fields[sep + 1]
    return fstype


def _read_sysctl(name: str) -> str | None:
    try:
        with open("/proc/sys/" + name.replace(".", "/")) as f:
            return f.read().strip()
    except OSError:
        return None


def userns_fix() -> str:
    """The sysctl (or kernel option) that keeps unprivileged user namespaces off here."""
    if _read_sysctl("kernel.unprivileged_userns_clone") == "0":
        return "enable user namespaces: sysctl -w kernel.unprivileged_userns_clone=1"
    if _read_sysctl("user.max_user_namespaces") == "0":
        return "enable user namespaces: sysctl -w user.max_user_namespaces=15000"
    if _read_sysctl("kernel.apparmor_restrict_unprivileged_userns") == "1":
        return ("AppArmor restricts user namespaces: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, "
                "or " + FIX_ROOT)
    if not os.path.exists("/proc/self/ns/user"):
        return "the kernel lacks CONFIG_USER_NS; " + FIX_ROOT
    return FIX_ROOT


def _probe_cgroups(privileged: bool) -> Check:
    from sandbox import cgroups

    layout = cgroups.detect_layout()
    if not layout.hierarchies:
        return Check("cgroups", False, "; ".join(layout.notes) or "no cgroup filesystem is mounted",
                     "mount cgroup2 at /sys/fs/cgroup (systemd does so by default)")
    parts, limitable = [], []
    for h in layout.hierarchies:
        ctrls = ",".join(sorted(h.controllers)) or "no controllers"
        parts.append(f"v{h.version} {h.mount_point} ({ctrls})")
    for resource in ("memory", "pids", "cpu", "kill"):
        serving = layout.for_resource(resource)
        if serving is not None and _can_create_cgroup(serving.base):
            limitable.append(resource)
    detail = "; ".join(parts)
    if {"memory", "pids"} <= set(limitable):
        return Check("cgroups", True, f"{detail}; limits settable: {', '.join(limitable)}")
    if privileged:
        fix = "mount the memory and pids controllers (cgroup2 with controllers enabled, or v1)"
    else:
        fix = ("limits need root (the ccw-helper service), or mount cgroup2 with controllers delegated: "
               "run ccw in a systemd scope with Delegate=yes (systemd-run --user --scope -p Delegate=yes ...)")
    settable = ", ".join(limitable) or "none"
    return Check("cgroups", False, f"{detail}; limits settable: {settable} (capsules run without limits; usage: no total memory, CPU time and the largest process from rusage)", fix)


def _can_create_cgroup(base: str) -> bool:
    probe = os.path.join(base, f"ccw-doctor-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return True


def _probe_landlock() -> Check:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION)
    if version >= 1:
        return Check("landlock", True, f"ABI version {version} (informational: ccw does not use it)")
    err = ctypes.get_errno()
    why = {errno.EOPNOTSUPP: "built but disabled at boot", errno.ENOSYS: "not built into this kernel"}
    return Check("landlock", None, f"unavailable: {why.get(err, os.strerror(err))} (informational)",
                 "add landlock to the lsm= boot parameter" if err == errno.EOPNOTSUPP else None)


def _probe_openat2(base: str) -> Check:
    with open(os.path.join(base, "inside"), "w") as f:
        f.write("x")
    dirfd = os.open(base, syscalls.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        resolve = syscalls.RESOLVE_BENEATH | syscalls.RESOLVE_NO_MAGICLINKS
        fd = syscalls.openat2(dirfd, "inside", os.O_RDONLY | os.O_CLOEXEC, 0, resolve)
        os.close(fd)
        try:
            escaped = syscalls.openat2(dirfd, "../", syscalls.O_PATH | os.O_CLOEXEC, 0, resolve)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
        else:
            os.close(escaped)
            return Check("openat2", False, "RESOLVE_BENEATH let '..' escape", "use a kernel of 5.6 or later",
                         "both")
    except OSError as exc:
        return Check("openat2", False, f"openat2 failed: {_describe(exc)}",
                     "use a kernel of 5.6 or later (the front end reads capsules with openat2)", "both")
    finally:
        os.close(dirfd)
    return Check("openat2", True, "RESOLVE_BENEATH works; '..' refused with EXDEV", None, "both")


def _probe_faketime() -> Check:
    from sandbox import namespaces

    library = namespaces.faketime_library()
    if library:
        return Check("libfaketime", True, f"{library} (wall-clock offsets for clock_offset_sec)")
    return Check("libfaketime", None, "not installed: clock_offset_sec shifts monotonic clocks only",
                 "apt-get install libfaketime")


def _probe_bubblewrap() -> Check:
    path = shutil.which("bwrap")
    if path is None:
        return Check("bubblewrap", None, "not installed (informational: ccw does not need it)")
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        version = f"version unknown: {exc}"
    return Check("bubblewrap", None, f"{path}: {version} (informational)")


def probe_service(path: str) -> Check:
    """Whether a system helper answers on ``path``, and in which mode."""
    from sandbox.client import BlockingClient
    from sandbox.errors import CcwError

    if not os.path.exists(path):
        return Check("helper_service", None, f"no helper socket at {path}",
                     "optional: install deploy/ccw-helper.socket and .service (see README)")
    try:
        with BlockingClient(path) as client:
            info = client.hello()
    except OSError as exc:
        fix = "add yourself to group ccw (usermod -aG ccw $USER) and log in again" \
            if exc.errno in (errno.EACCES, errno.EPERM) else "systemctl start ccw-helper.socket"
        return Check("helper_service", False, f"{path}: {_describe(exc)}", fix)
    except CcwError as exc:
        return Check("helper_service", False, f"{path} refused hello: {exc.message}", "check the helper's log")
    granted = ", ".join(service_grants(info.get("mechanisms") or {})) or "nothing beyond its mode"
    return Check("helper_service", True, f"{path} answers ({info.get('mode')} mode; grants {granted})")


def service_grants(mechanisms: dict[str, Any]) -> list[str]:
    """What a helper's ``hello`` mechanisms give its callers, in words for the report."""
    grants = []
    fanotify = mechanisms.get("fanotify")
    if isinstance(fanotify, dict) and fanotify.get("touched_read"):
        grants.append("fanotify read tracing")
    cgroups = mechanisms.get("cgroups")
    if isinstance(cgroups, dict):
        limits = [name for name in ("memory", "pids", "cpu") if cgroups.get(name)]
        if limits:
            grants.append("cgroups " + "/".join(limits))
    disk = mechanisms.get("disk")
    if isinstance(disk, dict) and disk.get("available"):
        grants.append("capsule disks")
    jail = mechanisms.get("jail")
    if isinstance(jail, dict) and isinstance(jail.get("seccomp"), dict) and jail["seccomp"].get("mode") == "filter":
        grants.append("seccomp")
    return grants


# --------------------------------------------------------------------- the report
def run(state_dir: str | None = None, helper_socket: str | None = None) -> dict[str, Any]:
    """Probe everything; the JSON-ready report (see the module docstring)."""
    euid = os.geteuid()
    privileged = euid == 0
    rootless = not privileged
    checks: list[Check] = []
    scratch_parent = state_dir if state_dir and os.path.isdir(state_dir) else None
    with tempfile.TemporaryDirectory(prefix=".ccw-doctor-", dir=scratch_parent) as scratch:
        os.chmod(scratch, 0o755)  # the user namespace's root must be able to enter it

        def fresh(name: str) -> str:
            path = os.path.join(scratch, name)
            os.mkdir(path)
            return path

        ok, detail = _in_child(_probe_namespace("user", rootless=False))
        checks.append(Check("namespace.user", ok, detail, None if ok else userns_fix(), "rootless"))
        userns_ok = ok
        for name in ("mount", "pid", "net", "uts", "ipc", "cgroup", "time"):
            if rootless and not userns_ok:
                checks.append(Check(f"namespace.{name}", False, "not probed: needs a user namespace first",
                                    userns_fix(), "both" if name in JAIL_NAMESPACES else ""))
                continue
            ok, detail = _in_child(_probe_namespace(name, rootless))
            fix = None if ok else ("use a kernel of 5.6 or later (CONFIG_TIME_NS) for clock offsets"
                                   if name == "time" else f"enable CONFIG_{name.upper()}_NS in the kernel")
            checks.append(Check(f"namespace.{name}", ok, detail, fix, "both" if name in JAIL_NAMESPACES else ""))
        if rootless and not userns_ok:
            checks.append(Check("overlayfs", False, "not probed: needs a user namespace first", userns_fix(), "both"))
        else:
            ok, detail = _in_child(_probe_overlay(fresh("overlay"), rootless))
            fix = None if ok else ("use a kernel of 5.11 or later (overlay userxattr) with the state dir on "
                                   "ext4, xfs, btrfs or tmpfs, or " + FIX_ROOT if rootless
                                   else "load the overlay module: modprobe overlay")
            checks.append(Check("overlayfs", ok, detail, fix, "both"))
        checks.append(_probe_cgroups(privileged))
        if privileged:
            ok, detail = _in_child(_probe_fanotify(fresh("fanotify")))
            checks.append(Check("fanotify", ok, detail, None if ok else "use a kernel of 5.1 or later "
                                "with CONFIG_FANOTIFY (touched.read stays null otherwise)"))
        else:
            checks.append(Check("fanotify", False, "FAN_MARK_FILESYSTEM needs CAP_SYS_ADMIN in the initial "
                                "user namespace: rootless capsules report touched.read as null", FIX_ROOT))
        if privileged:
            ok, detail = _in_child(_probe_disk(fresh("disk")))
            checks.append(Check("capsule_disk", ok, detail, None if ok else
                                "enable loop devices (CONFIG_BLK_DEV_LOOP) and ext4, install e2fsprogs; until "
                                "then capsules write to the state dir's filesystem without a size limit"))
        else:
            checks.append(Check("capsule_disk", False, "loop devices need root: a rootless helper's capsules write "
                                "to the state dir's filesystem without a size limit", FIX_ROOT))
        ok, detail = _in_child(_probe_seccomp)
        checks.append(Check("seccomp", ok, detail, None if ok else "use a kernel with CONFIG_SECCOMP_FILTER",
                            "both"))
        checks.append(_probe_landlock())
        checks.append(_probe_openat2(fresh("openat2")))
        checks.append(_probe_faketime())
        checks.append(_probe_bubblewrap())
        checks.append(probe_service(helper_socket or SERVICE_SOCKET))
    return _summarise(checks, privileged, euid)


def _summarise(checks: list[Check], privileged: bool, euid: int) -> dict[str, Any]:
    by_name = {c.name: c for c in checks}
    needed = [c for c in checks if c.required_for in ("both", "privileged" if privileged else "rootless")]
    missing = [c.name for c in needed if not c.ok]
    own_mode = "privileged" if privileged else "rootless"
    modes: dict[str, Any] = {
        "privileged": {"ok": privileged and not missing,
                       "detail": "running as root" if privileged else "needs root"},
        "rootless": {"ok": None if privileged else not missing,
                     "detail": "not used: running as root, the helper runs privileged" if privileged
                     else "user namespace + overlay userxattr"},
    }
    if missing:
        modes[own_mode]["detail"] = "missing: " + ", ".join(missing)
    service = by_name["helper_service"]
    modes["service"] = {"ok": service.ok, "detail": service.detail}
    chosen = own_mode if not missing else ("service" if service.ok else None)
    if service.ok and not privileged:
        chosen = "service"  # a reachable system helper is what CCW_HELPER_SOCKET users get
    try:
        user = pwd.getpwuid(euid).pw_name
    except KeyError:
        user = str(euid)
    return {
        "kernel": platform.release(),
        "arch": platform.machine(),
        "euid": euid,
        "user": user,
        "checks": [asdict(c) for c in checks],
        "modes": modes,
        "mode": chosen,
        "can_run": chosen is not None,
    }


def render(report: dict[str, Any], color: bool) -> str:
    """The report as a table for a terminal, with the fix under each missing feature."""
    def paint(text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if color else text

    marks = {True: paint("ok  ", "32"), False: paint("MISS", "31"), None: paint("info", "2")}
    width = max(len(c["name"]) for c in report["checks"])
    lines = [f"ccw doctor: kernel {report['kernel']} ({report['arch']}), running as {report['user']} "
             f"(uid {report['euid']})", ""]
    for check in report["checks"]:
        lines.append(f"  {marks[check['ok']]}  {check['name']:<{width}}  {check['detail']}")
        if check["fix"] and check["ok"] is not True:
            lines.append(f"        {'':<{width}}  fix: {check['fix']}")
    lines.append("")
    for mode, info in report["modes"].items():
        lines.append(f"  {marks[info['ok']]}  helper mode {mode:<10}  {info['detail']}")
    lines.append("")
    if report["can_run"]:
        lines.append(paint(f"capsules can run here: {report['mode']} mode", "32"))
    else:
        lines.append(paint("capsules cannot run here; apply a fix above", "31"))
    return "\n".join(lines) + "\n"
