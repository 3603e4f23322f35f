"""What works here: ``ccw doctor``'s probes of the kernel mechanisms ccw uses.

Nothing is guessed from version numbers: every probe does the thing ccw does, in a
forked child so that a namespace or mount it makes dies with it, and reports what
happened as a ``Finding`` (``features``).  A finding that is not ok names its ``cause``;
the front end (mcp_server/doctor.py) turns causes into fix texts and renders the table.
What the helper puts in force, for ``hello`` and a capsule's ``isolation``, is each
room's own report (sandbox/in_force.py).

Some facts the probes follow from:

- A helper running as root (``--privileged``) creates the jail's namespaces directly.
  An unprivileged helper (``--rootless``) first becomes root of a user namespace, and
  creates the others *inside* it; so, run unprivileged, each namespace probe enters a
  user namespace first, as the rootless helper would.
- Unprivileged user namespaces can be switched off in four places: the kernel config,
  Debian's ``kernel.unprivileged_userns_clone``, ``user.max_user_namespaces`` and
  Ubuntu's AppArmor ``kernel.apparmor_restrict_unprivileged_userns``.  The cause names
  whichever of these is set against us (``userns_cause``).
- overlayfs in a user namespace needs ``userxattr`` (5.11+) and an upper filesystem
  that stores ``user.*`` xattrs; the probe mounts one in the state dir (where capsules
  live) when it exists, with the same options the helper uses (``overlay.prepare``).
- fanotify ``FAN_MARK_FILESYSTEM`` needs CAP_SYS_ADMIN in the *initial* user namespace:
  a rootless helper can never have it, so rootless capsules report ``touched.read``
  as null.  The probe marks a real overlay and sees a real open.
- cgroup limits need a hierarchy the helper may create cgroups in: as root, any
  mounted one; unprivileged, only a delegated cgroup v2 subtree.  Without one,
  capsules still run, without limits and without the total memory of an exec (null);
  CPU time and the largest single process come from the jail init's rusage.  ``hello``
  asks ``access(W_OK)`` of each hierarchy's base; doctor makes and removes a cgroup.
- The seccomp probe installs ccw's own jail filter (seccomp.py) in a child and checks
  that a denied call (``keyctl``) fails with EPERM.
- The egress probe builds a capsule's network kit (egress.py), rootless in a user
  namespace as the helper would.  A veth the kernel cannot make fails with EOPNOTSUPP.
- Landlock and bubblewrap are informational: ccw uses neither, but they tell a user
  what else the machine offers.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from sandbox import jail_launcher, mountinfo, syscalls

PROBE_TIMEOUT_S = 15.0
# Probed after the user namespace, in this order; time only matters for clock offsets.
NAMESPACES = ("mount", "pid", "net", "uts", "ipc", "cgroup", "time")
LANDLOCK_CREATE_RULESET = 444  # the same number on x86_64 and aarch64 (unified table)
LANDLOCK_CREATE_RULESET_VERSION = 1


@dataclass(frozen=True)
class Finding:
    """One kernel feature probed for real: whether it works here, what was seen, and why not.

    ``cause`` names what is against us when the feature is missing (or, for an
    informational one, what would add it); the front end keys its fix texts on it.
    """

    name: str  # "namespace.user", "overlayfs", "cgroups", ...
    ok: bool | None  # None: informational (ccw does not need it)
    detail: str
    cause: str | None = None


# --------------------------------------------------------------------- what works here
def features(state_dir: str | None = None) -> list[Finding]:
    """Every kernel feature ccw uses, probed for real here, in the order doctor shows them.

    The probes' scratch dirs go in ``state_dir`` when it exists (where capsules would
    live) and are gone when this returns.
    """
    privileged = os.geteuid() == 0
    rootless = not privileged
    scratch_parent = state_dir if state_dir and os.path.isdir(state_dir) else None
    with tempfile.TemporaryDirectory(prefix=".ccw-doctor-", dir=scratch_parent) as scratch:
        os.chmod(scratch, 0o755)  # the user namespace's root must be able to enter it

        def fresh(name: str) -> str:
            path = os.path.join(scratch, name)
            os.mkdir(path)
            return path

        why = jail_launcher.missing()  # ccw-jail next to the package: no jail starts without it, nor the helper
        found = [Finding("jail_launcher", why is None, why or jail_launcher.PATH,
                         None if why is None else "no_jail_launcher"), *_namespaces(rootless)]
        userns_ok = bool(found[1].ok)
        found.append(_overlayfs(fresh, rootless, userns_ok))
        found.append(_cgroups(privileged))
        found.append(_fanotify(fresh) if privileged else Finding(
            "fanotify", False, "FAN_MARK_FILESYSTEM needs CAP_SYS_ADMIN in the initial user namespace: "
            "rootless capsules report touched.read as null", "needs_root"))
        found.append(_capsule_disk(fresh) if privileged else Finding(
            "capsule_disk", False, "loop devices need root: a rootless helper's capsules write to the state "
            "dir's filesystem without a size limit", "needs_root"))
        ok, detail = in_child(_seccomp)
        found.append(Finding("seccomp", ok, detail, None if ok else "no_seccomp"))
        found.append(_idmapped_mounts(privileged))
        found.append(_egress_network(rootless, userns_ok))
        found.append(_landlock())
        found.append(_openat2(fresh("openat2")))
        found.append(_faketime())
        found.append(_bubblewrap())
    return found


def _namespaces(rootless: bool) -> list[Finding]:
    ok, detail = in_child(_namespace_probe("user", rootless=False))
    found = [Finding("namespace.user", ok, detail, None if ok else userns_cause())]
    for name in NAMESPACES:
        if rootless and not found[0].ok:
            found.append(Finding(f"namespace.{name}", False, "not probed: needs a user namespace first",
                                 userns_cause()))
            continue
        ok, detail = in_child(_namespace_probe(name, rootless))
        cause = None if ok else "no_time_namespace" if name == "time" else "no_namespace"
        found.append(Finding(f"namespace.{name}", ok, detail, cause))
    return found


def _overlayfs(fresh: Callable[[str], str], rootless: bool, userns_ok: bool) -> Finding:
    if rootless and not userns_ok:
        return Finding("overlayfs", False, "not probed: needs a user namespace first", userns_cause())
    ok, detail = in_child(_overlay_probe(fresh("overlay"), rootless))
    return Finding("overlayfs", ok, detail, None if ok else "no_overlay_userxattr" if rootless else "no_overlay")


def _fanotify(fresh: Callable[[str], str]) -> Finding:
    ok, detail = in_child(_fanotify_probe(fresh("fanotify")))
    return Finding("fanotify", ok, detail, None if ok else "no_fanotify")


def _capsule_disk(fresh: Callable[[str], str]) -> Finding:
    ok, detail = in_child(_disk_probe(fresh("disk")))
    return Finding("capsule_disk", ok, detail, None if ok else "no_loop_disk")


def _idmapped_mounts(privileged: bool) -> Finding:
    """Whether a root caller's jail can be shown the host's trees idmapped (sandbox/idmap.py), the
    condition of its four file capabilities."""
    if not privileged:
        return Finding("idmapped_mounts", None,
                       "not used: a rootless helper's jail holds no capability (informational)")

    def probe() -> str:
        from sandbox import idmap

        if idmap.host_trees() is None:
            raise RuntimeError(idmap.why_not())
        return ("the host's trees are shown to a root caller's jail through a namespace mapping only root: "
                "its file capabilities reach only the capsule's trees")

    ok, detail = in_child(probe)
    return Finding("idmapped_mounts", ok, detail, None if ok else "no_idmapped_mounts")


def _egress_network(rootless: bool, userns_ok: bool) -> Finding:
    if rootless and not userns_ok:
        return Finding("egress_network", False, "not probed: needs a user namespace first", userns_cause())
    ok, detail = in_child(lambda: _egress_probe(rootless))
    no_veth = f"({errno.errorcode[errno.EOPNOTSUPP]})" in detail  # as describe() names it
    return Finding("egress_network", ok, detail, None if ok else "no_veth" if no_veth else "no_egress")


# --------------------------------------------------------------------- child probes
def in_child(probe: Callable[[], str]) -> tuple[bool, str]:
    """Run ``probe`` in a forked child; (True, its detail) or (False, the error it raised)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        os.close(read_fd)
        status = 0
        try:
            message = {"ok": True, "detail": probe()}
        except BaseException as exc:
            message = {"ok": False, "detail": describe(exc)}
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


def describe(exc: BaseException) -> str:
    """An exception as one line for a report: the errno's name beside its text."""
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


def _namespace_probe(name: str, rootless: bool) -> Callable[[], str]:
    def probe() -> str:
        if name == "user":
            _enter_user_namespace()
            return "unshare(CLONE_NEWUSER) and uid/gid maps written"
        if rootless:
            _enter_user_namespace()
        flag = "NS" if name == "mount" else name.upper()
        syscalls.unshare(getattr(syscalls, f"CLONE_NEW{flag}"))
        where = " inside a user namespace" if rootless else ""
        if name == "pid":  # the *next* child is pid 1 of the new namespace
            child = os.fork()
            if child == 0:
                os._exit(0 if os.getpid() == 1 else 3)
            _, status = os.waitpid(child, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError("the first child of a new pid namespace is not pid 1")
            return f"unshare(CLONE_NEWPID){where}; first child is pid 1"
        return f"unshare(CLONE_NEW{flag}){where}"

    return probe


def _egress_probe(rootless: bool) -> str:
    from sandbox import egress  # the helper's own code, only when probed

    if rootless:
        _enter_user_namespace()
    return egress.probe()


def _make_layers(base: str) -> tuple[str, str, str, str]:
    dirs = tuple(os.path.join(base, d) for d in ("lower", "upper", "work", "merged"))
    for d in dirs:
        os.mkdir(d)
    with open(os.path.join(dirs[0], "seen"), "w") as f:
        f.write("lower\n")
    return dirs  # type: ignore[return-value]


def _overlay_probe(base: str, rootless: bool) -> Callable[[], str]:
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
        return f"mounted on {mountinfo.filesystem_of(base)} ({options}); copy-up and whiteouts work"

    return probe


def _fanotify_probe(base: str) -> Callable[[], str]:
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


def _disk_probe(base: str) -> Callable[[], str]:
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


def _seccomp() -> str:
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
def _read_sysctl(name: str) -> str | None:
    try:
        with open("/proc/sys/" + name.replace(".", "/")) as f:
            return f.read().strip()
    except OSError:
        return None


def userns_cause() -> str:
    """What keeps unprivileged user namespaces off here: a sysctl, the kernel config, or root."""
    if _read_sysctl("kernel.unprivileged_userns_clone") == "0":
        return "userns_clone_off"
    if _read_sysctl("user.max_user_namespaces") == "0":
        return "max_user_namespaces_zero"
    if _read_sysctl("kernel.apparmor_restrict_unprivileged_userns") == "1":
        return "apparmor_restricts_userns"
    if not os.path.exists("/proc/self/ns/user"):
        return "no_user_namespaces"
    return "needs_root"


def _cgroups(privileged: bool) -> Finding:
    from sandbox import cgroups

    layout = cgroups.detect_layout()
    if not layout.hierarchies:
        return Finding("cgroups", False, "; ".join(layout.notes) or "no cgroup filesystem is mounted", "no_cgroupfs")
    parts, limitable = [], []
    for h in layout.hierarchies:
        ctrls = ",".join(sorted(h.controllers)) or "no controllers"
        parts.append(f"v{h.version} {h.mount_point} ({ctrls})")
    for resource in ("memory", "pids", "cpu", "kill"):
        serving = layout.for_resource(resource)
        if serving is not None and cgroups.can_create_child(serving.base):
            limitable.append(resource)
    detail = "; ".join(parts)
    if {"memory", "pids"} <= set(limitable):
        return Finding("cgroups", True, f"{detail}; limits settable: {', '.join(limitable)}")
    settable = ", ".join(limitable) or "none"
    return Finding("cgroups", False, f"{detail}; limits settable: {settable} (capsules run without limits; usage: "
                   "no total memory, CPU time and the largest process from rusage)",
                   "no_cgroup_controllers" if privileged else "no_cgroup_delegation")


def _landlock() -> Finding:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION)
    if version >= 1:
        return Finding("landlock", True, f"ABI version {version} (informational: ccw does not use it)")
    err = ctypes.get_errno()
    why = {errno.EOPNOTSUPP: "built but disabled at boot", errno.ENOSYS: "not built into this kernel"}
    return Finding("landlock", None, f"unavailable: {why.get(err, os.strerror(err))} (informational)",
                   "landlock_disabled" if err == errno.EOPNOTSUPP else None)


def _openat2(base: str) -> Finding:
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
            return Finding("openat2", False, "RESOLVE_BENEATH let '..' escape", "openat2_escapes")
    except OSError as exc:
        return Finding("openat2", False, f"openat2 failed: {describe(exc)}", "no_openat2")
    finally:
        os.close(dirfd)
    return Finding("openat2", True, "RESOLVE_BENEATH works; '..' refused with EXDEV")


def _faketime() -> Finding:
    from sandbox import namespaces

    library = namespaces.faketime_library()
    if library:
        return Finding("libfaketime", True, f"{library} (wall-clock offsets for clock_offset_sec)")
    return Finding("libfaketime", None, "not installed: clock_offset_sec shifts monotonic clocks only", "no_faketime")


def _bubblewrap() -> Finding:
    path = shutil.which("bwrap")
    if path is None:
        return Finding("bubblewrap", None, "not installed (informational: ccw does not need it)")
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        version = f"version unknown: {exc}"
    return Finding("bubblewrap", None, f"{path}: {version} (informational)")
