"""Build one jail: the plan made in the helper, the steps taken by its init.

This is nsjail's contain: ``prepare`` turns a ``JailSpec`` into a ``Plan`` in the helper,
and the jail's first process applies it step by step.  That process is ``ccw-jail``, a
small C program the helper posix_spawns with the plan (sandbox/jail_launcher.py says why C
and how the plan travels; sandbox/jail/ is the program, steps.c the steps, in the order
below).  supervise.py starts it, feeds it and waits for it.

The process tree of one exec::

    helper thread ── posix_spawn ─▶ jail init   pid 1 of a new pid namespace (the thread
                               │             unshares CLONE_NEWPID for its next child, then
                               │             setns back); moves itself into the exec's
                               │             cgroups, then builds the jail (steps.c),
                               │             drops every privilege, and reaps, forwards
                               │             signals, reports
                               └ posix_spawn ─▶ command   (vfork + exec)

A rootless helper cannot setns back into its pid namespace, so there ccw-jail unshares
the pid namespace and forks the init itself (a rootless helper has no cgroups).

Choices made here (no decision of ARCHITECTURE.md's settles them):

- The launcher decides nothing of the jail: every choice is the plan's, made here and
  in the modules it asks (namespaces.py, mounts.py, rootcaps.py, seccomp.py); what it
  decides itself (the command's PATH search, 126/127, the signals forwarded) its
  essay lists (sandbox/jail/ccw_jail.c).  Its steps are
  those of nsjail's containProc, in order: namespaces, the mount plan, hostname, ``lo``
  up, the time namespace, privileges dropped, chdir; each failure is an ``E`` report
  naming the step, as ``MountStep.describe`` and the names below word it.
- The init drops its own privileges before spawning the command, so the command
  inherits them (uid/gid, empty capability sets but a root caller's four file-ownership
  ones (rootcaps.py), no_new_privs, RLIMIT_CORE 0, and the
  seccomp filter of seccomp.py, installed last).  The
  init is then non-dumpable, so a command under the same uid can neither ptrace it nor
  open its /proc/1/fd; PR_SET_PDEATHSIG on the command itself is replaced by the pid
  namespace: when the init dies, the kernel kills every process in it.
- Rootless, the init first enters a user namespace of the command's own, which maps the
  user's own ids (``Plan.own_user_namespace``; namespaces.py's essay): after every mount,
  ``lo`` and the time namespace (which need the helper's namespace), before the
  privileges drop, since entering it gives back a full bounding set that the drop then
  empties, and long before seccomp, which denies the command ``unshare``.
- The launcher moves *itself* into the exec's cgroups, first thing, through files the
  helper opened (``ExecCgroup.entry_files``): nothing of the command's runs before every
  write has returned, and the cgroup namespace, unshared later, is rooted at the exec's
  cgroups, so the jail sees them as ``/``.
  Why the child writes rather than the helper: exec_cgroup.py's essay (the cost of a
  migration).
- Messages from the launcher and the init to the helper go over one pipe, each a single write
  shorter than PIPE_BUF (atomic): ``C`` a failed move into a cgroup, ``P`` the init's
  host pid, ``E`` a failed step,
  ``W`` the command's wait status (from the init), ``A`` the init's wait status,
  ``R`` the rusage of every process the init reaped (rusage.py), sent last.
  supervise.py reads them.
- When the command has exited, the init SIGKILLs what is left of the jail (``kill(-1)``
  reaches only its own pid namespace) and reaps it before it reports ``R`` and exits:
  what the kernel would do when the init exits, but done by the init, so that
  ``getrusage(RUSAGE_CHILDREN)`` covers every process the jail ever had.  This is the
  usage source where no cgroup serves (rootless mode).
- An exec on a terminal (``JailSpec.tty_fd``, a pty slave the caller sent) has it as
  descriptors 0, 1 and 2, and the command runs in a session of its own with it as
  controlling terminal (ccw_jail.c's ``spawn``), so a shell does job control and Ctrl-C reaches
  the foreground job, never the init.  The seccomp filter still denies TIOCSTI and
  TIOCLINUX on it.  The jail names it /dev/console (mounts.py: the jail's devpts is
  another instance, where it has no name), so ``tty`` and ttyname answer; the helper's
  name for it comes from ``readlink(/proc/self/fd/N)`` (``_terminal_name``).
- The init setns into a network namespace and moves a root tree onto /tmp when the
  helper made them ahead (supervise.py's spare pools, descriptors 5 and 6), or makes its
  own when none waits (the root tree from ``mounts.root_steps``, built in place).  An
  "egress" capsule's init always gets descriptor 5: the capsule's own jail namespace
  (egress.py), lo and eth0 already up.
- The command is found as execvp would find it (``PATH``, else ``/bin:/usr/bin``) and
  spawned with default signal dispositions and an empty mask; one that cannot be run is
  a result like a shell's: 127 (not found) or 126, with "ccw: NAME: reason" on stderr.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from sandbox import egress, mounts, namespaces, rootcaps, seccomp
from sandbox.errors import CcwError
from sandbox.jail_interface import DESCRIPTORS
from sandbox.spec import DEFAULT_OUTPUT_CAP, DEFAULT_TIMEOUT_MS, JAIL_HOSTNAME

_FD_REPORT = DESCRIPTORS["REPORT"]  # the init's report pipe (ccw-jail's FD_REPORT); 0-2 are the command's stdio
# Sent by the helper to the init on timeout: "end the jail yourself" (so that it still
# reports the rusage of what it reaps); not one of the forwarded signals.  A command may
# send it to its init too, which gains it nothing: it can kill(-1) its own jail anyway.
END_SIGNAL = signal.SIGRTMIN
_FORBIDDEN_WORKSPACES = ("/proc", "/dev", "/sys", mounts.OLD_ROOT)


@dataclass
class JailSpec:
    """One command to run, and the capsule it runs in."""

    merged_dir: str  # the capsule's overlay merged view (path in the helper's mount ns)
    workspace: str  # absolute path at which the merged view is bound read-write inside the jail
    tmp_dir: str  # becomes /tmp; persists across execs of the capsule
    home_dir: str  # becomes $HOME (env["HOME"]); persists across execs
    argv: list[str]
    cwd: str  # inside the jail
    env: dict[str, str]  # final: exactly what the command sees
    stdin: bytes | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    output_cap: int = DEFAULT_OUTPUT_CAP  # bytes kept per stream
    uid: int = 0
    gid: int = 0
    clock_offset_sec: int = 0
    hostname: str = JAIL_HOSTNAME
    network: str = "none"  # "none": an empty network namespace with lo up; "egress": net_fd's
    net_fd: int | None = None  # the capsule's network namespace (capsule_nets.py; the caller keeps it)
    binds: tuple[mounts.Bind, ...] = ()  # host dirs shown besides the workspace (toolchains, git dirs)
    tty_fd: int | None = None  # a pty slave: the command's stdio and controlling terminal (the caller keeps it)
    stdin_fd: int | None = None  # a pipe's read end: the command's stdin (the caller keeps it)
    stream: bool = False  # progress reports carry every byte of output since the last one


@dataclass(frozen=True)
class Plan:
    """Everything ccw-jail needs to build the jail, computed in the helper (jail_launcher.encode sends it)."""

    ns: namespaces.NamespacePlan
    mount_steps: list[mounts.MountStep]
    argv: list[str]
    env: dict[str, str]
    cwd: str
    uid: int
    gid: int
    set_uid: bool
    set_gid: bool
    clear_groups: bool
    last_cap: int
    keep_caps: int = 0  # rootcaps.kept_for: the capabilities the command keeps (a mask)
    seccomp_filter: seccomp.Filter | None = None  # built once in the helper; None: no filter for this arch
    notify_filter: seccomp.Filter | None = None  # the notifying filter: only where runs overlap (unotify.py)
    controlling_tty: bool = False  # stdin is a pty slave: the command's session takes it as its terminal
    own_user_namespace: bool = False  # rootless: uid/gid are the user's own, mapped to the launcher's (namespaces.py)


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 63


_LAST_CAP = _last_cap()


def _invalid(message: str, **details: object) -> CcwError:
    return CcwError("INVALID_ARGUMENT", message, dict(details))


def _check_spec(spec: JailSpec) -> None:
    """Refuse a jail the helper itself got wrong: what only it decides (where the capsule's
    dirs are, its network, the hostname) against what the jail mounts itself.  What the
    caller sent was checked once, where the helper took it in, and is not checked again:
    the request's argv, env names, cwd, timeout and output cap as it was read (sandbox/ops.py:
    ``ExecRequest``; the cwd inside the workspace by ``spec.resolve_cwd`` in execution.py's
    ``jail_spec``), the ids from SO_PEERCRED by ``access.check_uid_gid`` (manager.py's ``exec``)."""
    workspace = spec.workspace
    if not os.path.isabs(workspace) or os.path.normpath(workspace) != workspace or workspace == "/":
        raise _invalid(f"workspace {workspace!r} must be a normalised absolute path other than '/'")
    if any(mounts._under(workspace, p) for p in _FORBIDDEN_WORKSPACES) or workspace in ("/tmp", spec.env.get("HOME")):
        raise _invalid(f"workspace {workspace!r} collides with a path the jail mounts itself "
                       "(/proc, /dev, /sys, /tmp, $HOME)")
    for name in ("merged_dir", "tmp_dir", "home_dir"):
        path = getattr(spec, name)
        if not os.path.isdir(path):
            raise CcwError("NOT_FOUND", f"{name} {path!r} is not a directory; create the capsule's dirs first",
                           {"path": path})
    if spec.network not in ("none", "egress") or (spec.network == "egress" and spec.net_fd is None):
        raise CcwError("INTERNAL", f"network {spec.network!r} with net_fd {spec.net_fd}: 'egress' comes with "
                       "the capsule's namespace")
    if not 0 < len(spec.hostname.encode()) <= 64 or "\0" in spec.hostname:
        raise _invalid("hostname must be 1 to 64 bytes")


def _terminal_name(tty_fd: int | None) -> str | None:
    """The path the helper's mount namespace gives the exec's terminal (/dev/pts/N), or None."""
    if tty_fd is None:
        return None
    try:
        name = os.readlink(f"/proc/self/fd/{tty_fd}")
    except OSError:
        return None
    return name if name.startswith("/") else None  # "anon_inode:..." and the like are no path


def prepare(spec: JailSpec, host_trees_mapped: bool = False) -> Plan:
    """Check the spec and compute the jail's plan (mounts, namespaces, credentials).

    ``host_trees_mapped``: the jail will show the host's trees idmapped (sandbox/idmap.py),
    the condition of a root caller's file capabilities.
    """
    _check_spec(spec)
    ns = namespaces.prepare(spec.clock_offset_sec, spec.hostname, spec.env)
    home = spec.env.get("HOME")
    steps = mounts.prepare(
        merged_dir=spec.merged_dir,
        workspace=spec.workspace,
        tmp_dir=spec.tmp_dir,
        home=home if home and os.path.isabs(home) else None,
        home_dir=spec.home_dir,
        binds=spec.binds,
        terminal=_terminal_name(spec.tty_fd),
    )
    uid_ranges, gid_ranges = namespaces.read_id_maps()
    # Rootless: the user's own ids, which the command has once its user namespace maps them.
    own_ids = namespaces.command_ids(spec.uid, spec.gid)
    uid, gid = own_ids or (spec.uid, spec.gid)
    return Plan(
        ns=ns,
        mount_steps=steps,
        argv=list(spec.argv),
        env={**spec.env, **ns.extra_env},
        cwd=spec.cwd,
        uid=uid,
        gid=gid,
        # Rootless: an id with no mapping in our user namespace cannot be switched to.
        set_uid=own_ids is None and namespaces.is_mapped(spec.uid, uid_ranges),
        set_gid=own_ids is None and namespaces.is_mapped(spec.gid, gid_ranges),
        clear_groups=namespaces.setgroups_allowed(),
        last_cap=_LAST_CAP,
        keep_caps=rootcaps.kept_for(spec.uid, uid_ranges, host_trees_mapped),
        seccomp_filter=seccomp.prepare(),
        controlling_tty=spec.tty_fd is not None,
        own_user_namespace=own_ids is not None,
    )


def mechanisms() -> dict[str, object]:
    """What the jail puts in force, for ``hello`` and a capsule's ``isolation``."""
    info = namespaces.mechanisms()
    info.update({
        "root": "tmpfs, host system dirs read-only, workspace read-write at its own path",
        "proc": "fresh; /proc/sys, sysrq-trigger, irq, bus, fs read-only; kcore, keys, timer_list... masked",
        "dev": "minimal: null zero full random urandom tty (bound), devpts, shm; a terminal as console",
        "capabilities": rootcaps.mechanism(),
        "no_new_privs": True,
        "seccomp": seccomp.mechanisms(),
        "uid": "the caller's (SO_PEERCRED); rootless, the user's own in a user namespace of the command's",
        "init": "ccw-jail (C) as pid 1, spawned with posix_spawn; command started with posix_spawn",
        "direct_pid_namespace": namespaces.pid_namespace_restorable(),
        "network_egress": egress.MECHANISM,
    })
    return info
