"""The jail's root filesystem: a plan made in the helper, applied step by step in the jail.

``prepare`` (in the helper, where logging and stat are safe) turns a capsule's paths into
a flat list of ``MountStep``; ccw-jail (sandbox/jail/steps.c) applies them in order
inside the jail's fresh mount namespace.  The part
of the root that does not depend on the capsule (``root_steps``: the tmpfs, the host's
system dirs, the masked secrets, /dev) is a detached mount tree made by ``build_root``,
usually ahead of time on the helper's thread (``spare_root``).

Some facts about mounts, as the jail uses them:

- The first step makes every mount private (``MS_REC|MS_PRIVATE``): otherwise mounts
  made in the jail could propagate back to the host's shared mounts, and the host's
  later mounts into the jail.
- Like bubblewrap, the jail puts its tmpfs root on ``/tmp`` and pivots into it at
  once, with the host's root kept at ``/.oldroot``.  pivot_root moves the tmpfs away
  from ``/tmp``, so every source (even one under the host's /tmp) is reachable as
  ``/.oldroot/<path>`` until the old root is detached, one of the last steps.  Because
  absolute symlinks would then resolve against the new root, ``prepare`` resolves
  every source path with ``realpath`` first.
- The new mount API builds a tree that is attached nowhere: ``fsmount`` gives a fresh
  tmpfs as a descriptor, ``open_tree(OPEN_TREE_CLONE)`` a bind of a host path, and
  ``move_mount`` puts one onto the other (onto a detached tree since Linux 6.15; older
  kernels refuse with EINVAL, and there the jail attaches its tmpfs first).  Such a tree
  is no one's until it is moved into a namespace, so the helper's thread builds the
  next jail's root (about 45 syscalls) while the current jail builds its own, and the
  jail's init moves it onto ``/tmp`` with one call.  Each tree serves one jail: the
  tmpfs root, /dev, its devpts instance and /dev/shm are fresh superblocks.  A clone
  of a host mount joins the host mount's peer group, so the finished tree is made
  private (``mount_setattr`` propagation) before anyone can use it.  Cloning a detached
  tree is refused (EINVAL), so there is no one template for all jails.
- A bind mount keeps the flags of its source, and ``MS_RDONLY`` on the bind call itself
  is ignored.  ``mount_setattr(AT_RECURSIVE)`` makes a bind and everything under it
  read-only in one call, which a remount cannot do (it changes one mount only).  Binds
  are recursive because, in a user namespace (the rootless helper), binding a
  directory that has mounts on it without ``MS_REC`` fails: it would reveal what those
  mounts hide (Docker's /etc/hosts, for instance).
- /proc is mounted fresh, so it shows only the jail's pid namespace.  A root jail
  without capabilities can still write root-owned files that are writable by their mode
  bits, so, as Docker does, /proc/sys, /proc/sysrq-trigger, /proc/irq, /proc/bus and
  /proc/fs are read-only binds of themselves and /proc/kcore, /proc/keys,
  /proc/timer_list and the like are hidden under /dev/null or an empty read-only tmpfs.
- /etc/shadow, /etc/gshadow and their ``-`` backups are hidden by *name*, so not even a
  root caller's jail (uid 0 owns them, mode 0640) reads password hashes.  A mount on a
  file covers a dentry, not a name: useradd, passwd, chpasswd and vipw write a new file
  and rename it over the old one, and the kernel then detaches every mount on the old
  dentry in every other mount namespace.  A running jail and a root tree built ahead
  both read the new file (the old ``/dev/null`` binds; vm-tests/test_jail_etc_secrets.py).
  So /etc is a read-only overlay, ``lowerdir=mask:/etc`` with no upper dir, whose top
  layer is a 4 KiB tmpfs holding an empty mode-0000 file for each name, whether or not
  the host has it.  A lookup finds the mask's file and never asks the host's /etc: cat
  is refused (EACCES, the jail has no CAP_DAC_OVERRIDE), the size is 0, writes are
  refused.  Landlock could not do it (its rules allow, by inode), nor seccomp (no paths).
  The mask holds the jail's own ``hosts`` file too (``ETC_HOSTS``), which names the jail's
  hostname; a host's mount on /etc/hosts (a container's) is not bound over it.
- Overlayfs takes each layer by path: how the mask reaches it, detached or attached,
  is in sandbox/mounttree.py, with the other facts of the new mount API.
- A root caller's jail keeps four file capabilities, so every tree of the host's it is
  shown (``MountStep.host_tree``: the system dirs, /etc's lower layer and the mounts
  inside /etc, exposed toolchains, the helper's interpreter) is an idmapped clone that
  maps only root (sandbox/idmap.py says why and how), in a root tree of its own pool.
- A lower layer does not show mounts made on it, so the host's mounts inside /etc (a
  container's /etc/hosts, /etc/resolv.conf) are bound again over the overlay,
  read-only and recursive, never onto a secret's name.  They are read from mountinfo
  once per helper (``root_steps`` is cached): a mount the host makes inside /etc later
  reaches no jail.
- The host's later changes to /etc as a running jail sees them (6.18, measured with a
  jail waiting between two reads): an edit in place shows at once, and so does a name
  the jail has not looked up yet.  A name it already looked up keeps what it found, as
  overlayfs caches the lookup and does not revalidate a local lower layer: a file
  renamed over still reads the old bytes, a deleted file still reads, and a file
  created after a failed lookup stays ENOENT although ls lists it.  With the old
  recursive bind all of these were live.  Each jail has its own overlay, so this never
  outlives one command; a long-running jail sees /etc as of its first look at each name.
  The cost: ``build_root`` takes about 0.1 ms more (medians 0.40-0.53 -> 0.51-0.59 ms,
  three runs of 200), on the helper's thread, off the exec path.
- /sys is a fresh read-only sysfs (allowed in a user namespace that owns the network
  namespace), or else a read-only recursive bind of the host's.
- /dev is a small tmpfs with the host's null, zero, full, random, urandom and tty
  *bound* onto empty files: mknod is not allowed in a user namespace, binds are.
  devpts is a new instance (its own pty numbers) with /dev/ptmx a symlink into it.
  /dev is part of the root tree, so it is in place before the capsule's binds.
- An exec on a terminal has the caller's pty slave as descriptors 0-2, from the host's
  devpts, which the jail's /dev/pts is not.  glibc's ttyname reads /proc/self/fd/0 (the
  helper's name for it, /dev/pts/N, another node in the jail), then looks in /dev/pts,
  then in /dev stat-ing each entry, for one with the descriptor's st_dev, st_ino and
  st_rdev; finding none, it fails (``tty``: "not a tty"), and ssh, gpg-agent or script
  stumble.  So the init binds the slave onto /dev/console ("console"), the name runc,
  LXC and systemd-nspawn give a container's terminal: /dev/pts is the jail's own devpts,
  where no file can be made, and /dev/tty must stay the kernel's "my controlling
  terminal".  The source is the helper's path under /.oldroot, bound only if it leads
  to descriptor 0's own inode (mounttree.py: a descriptor from another mount namespace
  cannot be bound), else the terminal stays nameless.  The bind is read-only: a
  read-only mount refuses chmod, chown and utimes by that path, not reads and writes
  of a device.  A bind of one file has no ``..``: it reaches no other node of the
  host's devpts, and it is the inode the command already holds as descriptor 0.
- When the helper's state dir lies inside the workspace, its top directory there is
  covered by an empty read-only tmpfs (``state_inside_workspace``): the socket, the
  capsules' upper dirs and the front end's database stay out of the jail's sight, even
  a root caller's jail, which mode 0700 would not keep out (uid 0 owns them).
- The last step makes the tmpfs root read-only, so nothing outside the workspace,
  /tmp, $HOME, /dev/shm and /dev/pts can be created or removed, even by uid 0.
- ``unshare(CLONE_NEWNS)`` copies every mount of the caller's namespace, and detaching
  the old root unmounts every copy again: work in proportion to the helper's mount
  table, which holds an overlay and a disk per capsule.  With 200 mounts more, a jail
  took 0.57 ms longer (medians, issue 27).  Where the root tree comes built
  (``spare_root``), the jail needs nothing of the helper's namespace but its binds'
  sources, so ccw-jail first joins the *launch namespace* (``launch_namespace``): one
  read-only tmpfs holding the staging dir, made once per helper.  It copies that one
  mount instead.  The binds' sources are then detached clones the helper makes with
  ``open_tree`` in its own namespace, exactly where ccw-jail would have reached them as
  ``/.oldroot/<path>`` (no symlink followed for a "nofollow" bind, the terminal checked
  against descriptor 0 as before), and passed as descriptors (``detach_sources``); the
  jail's side of every bind (its mount point, inside the jail's own namespace, then the
  attributes) is unchanged.  ``/dev/null``, the mask of /proc's files, is the root
  tree's own.  Without a tree built ahead (kernels before 6.15), and in the rootless
  helper (its user namespace may mount /proc and /sys only beside visible instances of
  them, ``launch_namespace``), the jail copies the helper's namespace as before.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
import threading
from dataclasses import dataclass, replace

from sandbox import mountinfo as mountinfo_
from sandbox import mounttree, namespaces, syscalls
from sandbox.errors import JAIL_STEP_HINT, jail_step_error
from sandbox.spec import JAIL_HOST_ADDRESS, JAIL_HOSTNAME

OLD_ROOT = "/.oldroot"  # where the host's root stays visible until the old root is detached
STAGING = "/tmp"  # the host directory the tmpfs root is first mounted on (bubblewrap's habit)

# Host system directories bound read-only when present (symlinks like /bin -> usr/bin are
# recreated as symlinks).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
CONSOLE = "/dev/console"  # an exec's terminal, when it has one (see the essay)
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
PROC_MASKED_FILES = ("kcore", "keys", "timer_list", "timer_stats", "sched_debug", "latency_stats")
PROC_MASKED_DIRS = ("acpi", "scsi", "asound")
SYS_MASKED_DIRS = ("firmware", "devices/virtual/powercap")
# Hidden by name in the jail's /etc (an overlay whose top layer holds an empty mode-0000
# file for each), whether or not the host has them now: see the essay.
ETC_SECRETS = ("shadow", "shadow-", "gshadow", "gshadow-")
SECRET_FILES = tuple(f"/etc/{name}" for name in ETC_SECRETS)
# The jail's /etc/hosts, in that top layer too: the jail's hostname is the same on every host
# and in no host's hosts file, and git, sudo, hostname -f, Python's getfqdn and Java's
# getLocalHost look it up (a failed lookup fails some of them).  Docker writes its own too.
# On a line of its own at 127.0.1.1, as Debian's installer writes it: 127.0.0.1's name stays
# localhost, and getfqdn answers the hostname (all of 127/8 is the jail's loopback).
ETC_HOSTS = f"127.0.0.1\tlocalhost\n{JAIL_HOST_ADDRESS}\t{JAIL_HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"

_RO = syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV
_RW = syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV
_NOSUID_NOEXEC = syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NOEXEC
_ROOT_DATA = "mode=0755,size=1m"
_NOSUID_NODEV_NOEXEC = syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC
_RO_DEVICE = syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NOEXEC


@dataclass(frozen=True)
class Bind:
    """A host directory the capsule asks the jail to show at ``target`` (issue 25).

    Toolchains exposed read-only, a git dir outside the workspace shown through its own overlay
    read-write.  The helper checks each first; ``prepare`` places it (parents first), its source
    resolved, or if ``exact`` as is: the path just checked, reached following no symlink (ELOOP).
    """

    source: str  # a host path (resolved by prepare, unless exact)
    target: str  # where the jail shows it (absolute)
    writable: bool = False
    exact: bool = False


@dataclass(frozen=True)
class MountStep:
    """One step in building the jail's root; ``action`` names what ccw-jail does (steps.c)."""

    # action: private root bind bind_over etc symlink mask_file mask_dir proc sysfs dev devpts tmpfs console
    # detach_old_root seal_root
    action: str
    target: str
    source: str = ""
    attrs: int = 0  # MOUNT_ATTR_* set recursively after a bind, or of a new mount in the root tree
    data: str = ""  # mount options, or a symlink's text
    source_is_file: bool = False  # a bind's source is not a directory: its mount point is an empty file
    from_fd: bool = False  # ``source`` is the number of the launcher's descriptor holding a clone (detach_sources)
    host_tree: bool = False  # a host tree the capsule does not own: idmapped for a root caller's jail (idmap.py)

    def describe(self) -> str:
        """A short human description for error messages: ``bind /.oldroot/usr -> /usr``."""
        if self.source:
            return f"{self.action} {self.source} -> {self.target}"
        return f"{self.action} {self.target}"


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _depth(path: str) -> int:
    return len([part for part in path.split("/") if part])


def system_steps(host_root: str = "/", mountinfo: str = "") -> list[MountStep]:
    """Read-only binds (or symlinks) of the host's system directories that exist.

    /etc is the read-only overlay that hides ``ETC_SECRETS`` by name, followed by binds
    of whatever the host has mounted inside its /etc (``mountinfo``: the text of
    /proc/self/mountinfo), which an overlay's lower layer does not show.
    """
    steps = []
    for name in SYSTEM_DIRS:
        host_path = os.path.join(host_root, name)
        if os.path.islink(host_path):
            steps.append(MountStep("symlink", "/" + name, data=os.readlink(host_path)))
        elif name == "etc" and os.path.isdir(host_path):
            steps.append(MountStep("etc", "/etc", "/etc", attrs=_RO, data=ETC_HOSTS, host_tree=True))
            steps += [MountStep("bind_over", point, point, attrs=_RO, host_tree=True)
                      for point in etc_submounts(mountinfo)]
        elif os.path.isdir(host_path):
            steps.append(MountStep("bind", "/" + name, "/" + name, attrs=_RO, host_tree=True))
    return steps


def etc_submounts(mountinfo: str) -> list[str]:
    """The host's outermost mount points strictly inside /etc, but never a secret's name nor
    /etc/hosts (the jail has its own: ``ETC_HOSTS``).

    A container's /etc/hosts and /etc/resolv.conf are binds like these.  Each is bound
    recursively, so mounts nested inside one come along and are not listed.
    """
    every = [m.mount_point for m in mountinfo_.parse(mountinfo)]
    points = sorted({point for point in every if _under(point, "/etc") and point != "/etc"
                     and point not in (*SECRET_FILES, "/etc/hosts")})
    return [point for point in points if not any(_under(point, other) for other in points if other != point)]


@functools.lru_cache(maxsize=1)
def python_prefix() -> str | None:
    """The interpreter's prefix when it lies outside the system dirs and is readable (pyenv, /opt/...)."""
    prefix = os.path.realpath(sys.base_prefix)
    if any(_under(prefix, "/" + name) for name in SYSTEM_DIRS) or prefix == "/":
        return None
    if not os.access(prefix, os.R_OK | os.X_OK):
        return None  # e.g. under /root while the helper runs rootless: skip rather than fail
    return prefix


@functools.lru_cache(maxsize=1)
def root_steps() -> tuple[MountStep, ...]:
    """What ``build_root`` puts in the jail's root tree (host paths as sources): computed once."""
    steps = system_steps(mountinfo=mountinfo_.read())
    steps.append(MountStep("dev", "/dev", data="mode=0755,size=64k", attrs=_NOSUID_NOEXEC))
    # No nosuid/nodev/ro attrs on single device binds: /dev is a nosuid tmpfs, and
    # the nodes must stay usable; each skipped mount_setattr is a syscall per exec.
    steps += [MountStep("bind", f"/dev/{n}", f"/dev/{n}", source_is_file=True)
              for n in DEVICES if os.path.exists(f"/dev/{n}")]
    steps.append(MountStep("devpts", "/dev/pts", data="newinstance,ptmxmode=0666,mode=0620", attrs=_NOSUID_NOEXEC))
    steps.append(MountStep("tmpfs", "/dev/shm", data="mode=1777", attrs=_RW))
    return tuple(steps)


@functools.lru_cache(maxsize=1)
def _kernel_steps() -> tuple[MountStep, ...]:
    """/proc and /sys with their masks (mounted by the jail's init: they follow its namespaces)."""
    kernel = [MountStep("proc", "/proc")]
    kernel += [MountStep("bind", f"/proc/{n}", f"/proc/{n}", attrs=_RO | syscalls.MOUNT_ATTR_NOEXEC)
               for n in PROC_READONLY if os.path.exists(f"/proc/{n}")]
    kernel += [MountStep("mask_file", f"/proc/{n}") for n in PROC_MASKED_FILES if os.path.exists(f"/proc/{n}")]
    kernel += [MountStep("mask_dir", f"/proc/{n}") for n in PROC_MASKED_DIRS if os.path.isdir(f"/proc/{n}")]
    kernel.append(MountStep("sysfs", "/sys"))
    kernel += [MountStep("mask_dir", f"/sys/{n}") for n in SYS_MASKED_DIRS if os.path.isdir(f"/sys/{n}")]
    return tuple(kernel)


def prepare(
    *,
    merged_dir: str,
    workspace: str,
    tmp_dir: str,
    home: str | None,
    home_dir: str,
    binds: tuple[Bind, ...] = (),
    terminal: str | None = None,
) -> list[MountStep]:
    """The jail's mount plan, in order; ccw-jail takes each step inside the jail's mount namespace.

    ``terminal``: the host's path of the exec's pty slave (the helper's readlink of it),
    shown as ``CONSOLE`` if it still leads there when the jail is built.

    ``binds`` come after the private $HOME at equal depth or deeper (sorting is stable
    and by depth), so a toolchain under the caller's home shows through the empty one.
    """
    steps = [MountStep("private", "/"), MountStep("root", STAGING)]

    # Capsule binds, parents before children (a workspace may live under /tmp or $HOME).
    capsule = [
        MountStep("bind", workspace, OLD_ROOT + os.path.realpath(merged_dir), attrs=_RW),
        MountStep("bind", "/tmp", OLD_ROOT + os.path.realpath(tmp_dir), attrs=_RW),
    ]
    if home and home != "/" and not _under(home, workspace):
        capsule.append(MountStep("bind", home, OLD_ROOT + os.path.realpath(home_dir), attrs=_RW))
    prefix = python_prefix()
    if prefix is not None and not _under(prefix, workspace):
        capsule.append(MountStep("bind", prefix, OLD_ROOT + prefix, attrs=_RO, host_tree=True))
    # A writable bind is the capsule's own (a git dir's overlay); a read-only one is the host's (a toolchain).
    capsule += [MountStep("bind", bind.target,
                          OLD_ROOT + (bind.source if bind.exact else os.path.realpath(bind.source)),
                          attrs=_RW if bind.writable else _RO, data="nofollow" if bind.exact else "",
                          host_tree=not bind.writable) for bind in binds]
    steps += sorted(capsule, key=lambda step: _depth(step.target))
    steps += [MountStep("mask_dir", path) for path in state_inside_workspace(workspace, merged_dir, tmp_dir, home_dir)]

    if terminal is not None:
        steps.append(MountStep("console", CONSOLE, OLD_ROOT + terminal, attrs=_RO_DEVICE))
    steps += _kernel_steps()
    steps += [MountStep("detach_old_root", OLD_ROOT), MountStep("seal_root", "/")]
    return steps


def state_inside_workspace(workspace: str, *capsule_dirs: str) -> list[str]:
    """Jail paths to hide: the top directory under the workspace that holds a capsule's own dirs.

    A state dir inside the workspace (``./.ccw-state``) is in the capsule's lower layer,
    and mode 0700 does not keep out a root caller's jail (see the essay).
    """
    real_workspace = os.path.realpath(workspace)
    hidden = set()
    for path in capsule_dirs:
        real = os.path.realpath(path)
        if real != real_workspace and _under(real, real_workspace):
            top = os.path.relpath(real, real_workspace).split("/")[0]
            hidden.add(os.path.join(workspace, top))
    return sorted(hidden)


# --- the root tree (new mount API; relative to the tree's descriptor) -----------------

_DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
              ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx"))


def build_root(idmap: int | None = None) -> int:
    """The jail's root before its capsule (``root_steps``, with ``/.oldroot``), as a detached mount.

    Kernels older than 6.15 refuse it (EINVAL: no mounting onto a detached tree); there
    ccw-jail builds the same tree in place from ``root_steps`` (sandbox/jail/steps.c).
    ``idmap``: the host trees shown through that user namespace (a root caller's jail: idmap.py).
    """
    root = mounttree.new_mount("tmpfs", _ROOT_DATA, _RW)
    try:
        os.mkdir(OLD_ROOT.lstrip("/"), 0o700, dir_fd=root)
        for step in root_steps():
            _build(root, step, idmap if step.host_tree else None)
        # Clones of host mounts joined their peer groups: keep the host's later mounts out.
        syscalls.mount_setattr("", 0, flags=syscalls.AT_EMPTY_PATH | syscalls.AT_RECURSIVE, dirfd=root,
                               propagation=syscalls.MS_PRIVATE)
    except BaseException:
        os.close(root)
        raise
    return root


_spare_roots_work: bool | None = None  # None: not tried yet


def spare_root() -> int | None:
    """A detached root tree for a later jail (see the essay), or None where the kernel cannot build one."""
    global _spare_roots_work
    if _spare_roots_work is False:
        return None
    try:
        root = build_root()
    except OSError:
        # EINVAL before 6.15 (no mounting onto a detached tree); the jail builds its own.
        _spare_roots_work = False
        return None
    _spare_roots_work = True
    return root


def _build(root: int, step: MountStep, idmap: int | None) -> None:
    rel = step.target.lstrip("/")
    action = step.action
    if action == "bind":
        mounttree.mountpoint_at(root, rel, step.source_is_file)
        mounttree.attach(mounttree.clone(step.source, step.attrs, idmap=idmap), root, rel)
    elif action == "bind_over":
        # Onto a path the overlay below already shows (read-only: no mount point to make).
        mounttree.attach(mounttree.clone(step.source, step.attrs, idmap=idmap), root, rel)
    elif action == "etc":
        mounttree.mountpoint_at(root, rel)
        mounttree.attach(mounttree.etc_overlay(step.source, step.attrs, ETC_SECRETS, step.data, idmap), root, rel)
    elif action == "symlink":
        os.symlink(step.data, rel, dir_fd=root)
    elif action in ("dev", "devpts", "tmpfs"):
        mounttree.mountpoint_at(root, rel)
        mounttree.attach(mounttree.new_mount("devpts" if action == "devpts" else "tmpfs", step.data, step.attrs),
                         root, rel)
        if action == "dev":
            for name, link in _DEV_LINKS:
                os.symlink(link, f"{rel}/{name}", dir_fd=root)
    else:
        raise OSError(22, f"unknown root tree step {action!r}")


# --- the launch namespace (see the essay) ------------------------------------------

_launch_lock = threading.Lock()
_launch: list[int | None] = []  # [descriptor] once made (or [None]: this helper cannot make one)


def launch_namespace() -> int | None:
    """The mount namespace ccw-jail copies when its root tree and binds come as descriptors:
    one read-only tmpfs holding the staging dir.  Made once, on a thread of its own (a
    thread that unshares its filesystem data leaves the helper's other threads as they
    are); None where it cannot be made, and in a user namespace (the rootless helper):
    there the kernel lets a jail mount /proc and /sys only where an instance of each is
    already fully visible in its namespace (``mount_too_revealing``), as the copy of the
    helper's own table has them.  The helper keeps the descriptor for its life."""
    with _launch_lock:
        if not _launch:
            initial = namespaces.is_initial_user_namespace(namespaces.read_id_maps()[0])
            _launch.append(_make_launch() if initial else None)
        return _launch[0]


def _make_launch() -> int | None:
    made: list[int] = []

    def work() -> None:  # this thread's own namespace, from its unshare to its end
        try:
            syscalls.unshare(syscalls.CLONE_FS | syscalls.CLONE_NEWNS)
        except OSError:
            return
        namespace = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
            top = mounttree.new_mount("tmpfs", "mode=0755,size=4k,nr_inodes=8", _NOSUID_NOEXEC)
            try:
                mounttree.mountpoint_at(top, STAGING.lstrip("/"))
                syscalls.mount_setattr("", syscalls.MOUNT_ATTR_RDONLY, flags=syscalls.AT_EMPTY_PATH, dirfd=top)
                syscalls.move_mount(top, "", syscalls.AT_FDCWD, STAGING, syscalls.MOVE_MOUNT_F_EMPTY_PATH)
            finally:
                os.close(top)
            # The tmpfs becomes the root, the old one stacked on it and detached: one mount left.
            os.chdir(STAGING)
            syscalls.pivot_root(".", ".")
            syscalls.umount2(".", syscalls.MNT_DETACH)
        except OSError:
            os.close(namespace)
            return
        made.append(namespace)

    maker = threading.Thread(target=work, name="ccw-launch-ns", daemon=True)
    maker.start()
    maker.join()
    return made[0] if made else None


def detach_sources(steps: list[MountStep], first_fd: int,
                   idmap: int | None = None) -> tuple[list[MountStep], list[int]]:
    """``steps`` with each bind and the terminal's source under /.oldroot replaced by a
    detached clone (made here, in the helper's namespace), and the clones, to be the
    launcher's descriptors ``first_fd`` on in order.  The caller closes them.  A source
    that cannot be cloned fails as its step would in the jail (a terminal is left nameless).
    ``idmap``: each host tree's clone shows its owners through that user namespace (idmap.py)."""
    out: list[MountStep] = []
    fds: list[int] = []
    try:
        for step in steps:
            if step.action not in ("bind", "console") or not step.source.startswith(OLD_ROOT + "/"):
                out.append(step)
                continue
            host = step.source[len(OLD_ROOT):]
            try:
                if step.action == "console" or step.data == "nofollow":  # as ccw-jail opens them: no symlink followed
                    flags = os.O_PATH | os.O_CLOEXEC | (0 if step.action == "console" else os.O_DIRECTORY)
                    node = syscalls.openat2(syscalls.AT_FDCWD, host, flags, resolve=syscalls.RESOLVE_NO_SYMLINKS)
                    try:
                        tree = mounttree.clone("", 0, dirfd=node, idmap=idmap if step.host_tree else None)
                    finally:
                        os.close(node)
                else:
                    tree = mounttree.clone(host, 0, idmap=idmap if step.host_tree else None)
            except OSError as exc:
                if step.action == "console":
                    continue
                raise jail_step_error(step.describe(), exc, _unmapped_hint(step, idmap, exc)) from exc
            fds.append(tree)
            # Private, as a bind made after the jail's first step would be (see the essay).
            syscalls.mount_setattr("", 0, flags=syscalls.AT_EMPTY_PATH | syscalls.AT_RECURSIVE, dirfd=tree,
                                   propagation=syscalls.MS_PRIVATE)
            out.append(replace(step, source=str(first_fd + len(fds) - 1), from_fd=True))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return out, fds



def _unmapped_hint(step: MountStep, idmap: int | None, exc: OSError) -> str:
    """What to do when a host tree refuses its idmap (EINVAL: its filesystem has no idmapped mounts)."""
    if idmap is None or not step.host_tree or exc.errno != errno.EINVAL:
        return JAIL_STEP_HINT
    return (f"{step.target} is shown to a root caller's jail through an idmapped mount (sandbox/idmap.py), so that "
            "its file capabilities reach no other user's files there, and its filesystem refused one (NFS and "
            "FUSE do): expose a copy on a local filesystem, leave it out of expose, or run ccw as that user")
