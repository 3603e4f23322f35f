"""``ccw doctor``: which kernel features work *here*, each probed for real, and how to fix the rest.

The probing is the helper's (``sandbox.probe.features``: every probe does the thing ccw
does, in a forked child, and says what happened and, when a feature is missing, its
cause).  This module keeps what the user reads: the fix for each cause, which helper
mode needs which feature, whether a system helper answers, and the table.

``run()`` returns the report (JSON-ready); ``render()`` makes the table.  Capsules can
run when the helper can run in some mode: privileged (root: mount, pid, net, uts,
ipc, cgroup namespaces and overlayfs), rootless (user namespace + the same inside it),
or through a reachable system helper service (``CCW_HELPER_SOCKET``).
"""

from __future__ import annotations

import errno
import os
import platform
import pwd
from dataclasses import asdict, dataclass
from typing import Any

from sandbox import probe
from sandbox.spec import JAIL_NAMESPACES  # what every jail needs; time only for clock offsets

SERVICE_SOCKET = "/run/ccw/helper.sock"
FIX_ROOT = "run as root, or install the ccw-helper service (deploy/) and join group ccw"
# The fix for each cause a probe names (sandbox.probe.Finding.cause).
FIXES = {
    "userns_clone_off": "enable user namespaces: sysctl -w kernel.unprivileged_userns_clone=1",
    "max_user_namespaces_zero": "enable user namespaces: sysctl -w user.max_user_namespaces=15000",
    "apparmor_restricts_userns": ("AppArmor restricts user namespaces: sysctl -w "
                                  "kernel.apparmor_restrict_unprivileged_userns=0, or " + FIX_ROOT),
    "no_user_namespaces": "the kernel lacks CONFIG_USER_NS; " + FIX_ROOT,
    "needs_root": FIX_ROOT,
    "no_time_namespace": "use a kernel of 5.6 or later (CONFIG_TIME_NS) for clock offsets",
    "no_overlay_userxattr": ("use a kernel of 5.11 or later (overlay userxattr) with the state dir on "
                             "ext4, xfs, btrfs or tmpfs, or " + FIX_ROOT),
    "no_overlay": "load the overlay module: modprobe overlay",
    "no_cgroupfs": "mount cgroup2 at /sys/fs/cgroup (systemd does so by default)",
    "no_cgroup_controllers": "mount the memory and pids controllers (cgroup2 with controllers enabled, or v1)",
    "no_cgroup_delegation": ("limits need root (the ccw-helper service), or mount cgroup2 with controllers delegated: "
                             "run ccw in a systemd scope with Delegate=yes "
                             "(systemd-run --user --scope -p Delegate=yes ...)"),
    "no_fanotify": "use a kernel of 5.1 or later with CONFIG_FANOTIFY (touched.read stays null otherwise)",
    "no_loop_disk": ("enable loop devices (CONFIG_BLK_DEV_LOOP) and ext4, install e2fsprogs; until "
                     "then capsules write to the state dir's filesystem without a size limit"),
    "no_seccomp": "use a kernel with CONFIG_SECCOMP_FILTER",
    "no_idmapped_mounts": ("until the kernel is 6.15 or later and the system dirs are on a filesystem with idmapped "
                           "mounts (ext4, xfs, btrfs, tmpfs), a root caller's jail keeps no file capability: a "
                           "checkout of another uid is read-only in its capsules; run ccw as that uid meanwhile"),
    "no_jail_launcher": "reinstall ccw (pip install --force-reinstall ccw; in a checkout ./dev setup, or "
                        "python setup.py launcher to build only it): it needs gcc",
    "landlock_disabled": "add landlock to the lsm= boot parameter",
    "openat2_escapes": "use a kernel of 5.6 or later",
    "no_openat2": "use a kernel of 5.6 or later (the front end reads capsules with openat2)",
    "no_faketime": "apt-get install libfaketime",
    "no_veth": ("load the veth module: modprobe veth (CONFIG_VETH); until then capsules can only have "
                "network none"),
    "no_egress": ("network allowlists need veth, IPv6 and packet sockets (CONFIG_VETH, CONFIG_IPV6, "
                  "CONFIG_PACKET; see the detail for the step that failed); until then capsules can only "
                  "have network none"),
}
# Which helper mode needs each feature ("both", "rootless", or "" for optional).
REQUIRED_FOR = {"jail_launcher": "both", "namespace.user": "rootless", "overlayfs": "both", "seccomp": "both",
                "openat2": "both",
                **{f"namespace.{name}": "both" for name in JAIL_NAMESPACES}}


@dataclass
class Check:
    """One probed feature: whether it works here, what was seen, and how to fix it."""

    name: str
    ok: bool | None  # None: not applicable or informational only
    detail: str
    fix: str | None = None
    required_for: str = ""  # which mode needs it: "privileged", "rootless", "both", "" (optional)


def fix_for(finding: probe.Finding) -> str | None:
    """The fix text for a finding's cause; None when nothing is against us.

    A cause without a text here (a bug: tests/test_doctor_causes.py checks that every
    cause the probe names has one) still gets a row that names it, rather than failing
    the whole report.
    """
    if finding.cause is None:
        return None
    if finding.cause == "no_namespace":
        return f"enable CONFIG_{finding.name.removeprefix('namespace.').upper()}_NS in the kernel"
    return FIXES.get(finding.cause, f"no fix is known for cause {finding.cause!r} (please report it); see the detail")


def check_of(finding: probe.Finding) -> Check:
    """A probe's finding as a row of the report: its fix, and which mode needs it."""
    return Check(finding.name, finding.ok, finding.detail, fix_for(finding), REQUIRED_FOR.get(finding.name, ""))


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
        return Check("helper_service", False, f"{path}: {probe.describe(exc)}", fix)
    except CcwError as exc:  # UNSUPPORTED: the service runs another ccw install than this one
        fix = ("install this ccw for the service too, then systemctl restart ccw-helper.service"
               if exc.code == "UNSUPPORTED" else "check the helper's log")
        return Check("helper_service", False, f"{path} refused hello: {exc.message}", fix)
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
    checks = [check_of(finding) for finding in probe.features(state_dir)]
    checks.append(probe_service(helper_socket or SERVICE_SOCKET))
    return _summarise(checks, euid == 0, euid)


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
