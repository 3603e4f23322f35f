"""The host's cgroup layout: which hierarchy serves each resource, and where ccw's cgroups go.

Pure parsers of /proc/self/cgroup, /proc/cgroups and (through mountinfo.py) the cgroup
mounts, the layout built from them, and the few cgroupfs file operations that the
layout and the per-exec cgroups (exec_cgroup.py) share.

Some facts about cgroup layouts on the machines ccw runs on
-----------------------------------------------------------
- The layout differs per host, so it is *detected*, never assumed: /proc/self/mountinfo
  names every cgroup/cgroup2 mount and its super options (which v1 controllers it
  carries), /proc/self/cgroup says where this process sits in each hierarchy, and
  /proc/cgroups says which controllers the kernel has.  The parsers are pure functions
  over file contents (psutil's habit) and are tested against fake files.
- Each resource comes from the best place available: cgroup v2 when its controller is
  enabled there, else the v1 hierarchy carrying it.  A v2 hierarchy with *no*
  controllers (hybrid hosts, such as the CI VM: v1 memory/cpu/cpuacct/pids/blkio and an
  empty cgroup2 at /sys/fs/cgroup/unified) can still serve: every non-root v2 cgroup has
  ``cgroup.kill`` (5.14+), which kills a whole tree atomically, and ``cpu.stat`` with
  ``usage_usec``, which needs no controller.  But joining v2 takes the kernel's global
  migration lock (exec_cgroup.py's essay), so it serves ``cpu`` only without a v1
  cpuacct, and ``kill`` only without a v1 freezer.
- The helper may itself sit in a non-root cgroup (a systemd service; on the CI VM a
  per-command v1 memory cgroup).  ccw's parent cgroup ``ccw`` is created under the
  helper's *own* cgroup in each hierarchy, so the helper's own limits keep applying to
  what it runs, and a delegated v2 subtree works without root.  A hierarchy where the
  mkdir is refused is skipped and the reason kept.
- cgroup v2 forbids controllers in the subtree of a cgroup that holds processes (the
  "no internal processes" rule), and systemd starts a ``Delegate=yes`` service *in* the
  cgroup it delegates (systemd 254's ``DelegateSubgroup=`` is not in Debian 12). So
  a privileged helper that is alone in its v2 cgroup moves itself into a leaf,
  ``<own>/ccw-helper`` (``enter_leaf``), and the layout takes a cgroup of that name as
  the helper's leaf: ``ccw`` is made beside it, under ``<own>``, which then holds no
  process. Found by booting the Vagrant VM, where every exec failed with EBUSY.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sandbox import mountinfo
from sandbox.errors import CcwError, from_oserror

HELPER_LEAF = "ccw-helper"  # the v2 leaf a helper alone in its cgroup moves into (see the essay)
# v1 controllers ccw uses; cpuset is left alone (a child needs cpus/mems before any task joins).
V1_WANTED = ("memory", "pids", "cpu", "cpuacct", "blkio", "freezer")
HINT = "run the helper as root, or delegate a cgroup v2 subtree to it (systemd Delegate=yes)"


# --------------------------------------------------------------------- pure parsers
@dataclass(frozen=True)
class CgroupMount:
    """One cgroup or cgroup2 line of mountinfo."""

    mount_point: str
    root: str  # the path inside the hierarchy that is mounted there
    version: int  # 1 or 2
    options: frozenset[str]  # super options: v1 controller names live here


def cgroup_mounts(text: str) -> list[CgroupMount]:
    """The cgroup mounts in a /proc/self/mountinfo text, in order."""
    return [CgroupMount(mount_point=m.mount_point, root=m.root, version=2 if m.fstype == "cgroup2" else 1,
                        options=m.super_options)
            for m in mountinfo.parse(text) if m.fstype in ("cgroup", "cgroup2")]


def parse_proc_cgroups(text: str) -> dict[str, tuple[int, bool]]:
    """/proc/cgroups → {controller: (hierarchy id, enabled)}; hierarchy 0 = v2 or unmounted."""
    result = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) >= 4:
            result[parts[0]] = (int(parts[1]), parts[3] == "1")
    return result


def parse_self_cgroup(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup → {key: path}; key is the v1 controller list ("cpu,cpuacct") or "" for v2."""
    result = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            result[parts[1]] = parts[2]
    return result


def parse_flat_keyed(text: str) -> dict[str, int]:
    """Files like cpu.stat, memory.events, pids.events, memory.oom_control: "key value" lines."""
    result = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            with contextlib.suppress(ValueError):
                result[parts[0]] = int(parts[1])
    return result


def parse_blkio_bytes(text: str) -> tuple[int, int]:
    """blkio.throttle.io_service_bytes → (read bytes, write bytes) summed over devices."""
    read = write = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "Read":
            read += int(parts[2])
        elif len(parts) == 3 and parts[1] == "Write":
            write += int(parts[2])
    return read, write


def parse_io_stat(text: str) -> tuple[int, int]:
    """v2 io.stat ("MAJ:MIN rbytes=.. wbytes=.. ...") → (read bytes, write bytes)."""
    read = write = 0
    for line in text.splitlines():
        for item in line.split()[1:]:
            key, _, value = item.partition("=")
            if key == "rbytes":
                read += int(value)
            elif key == "wbytes":
                write += int(value)
    return read, write


@dataclass(frozen=True)
class Hierarchy:
    """One hierarchy ccw can use, and this process's own cgroup dir in it."""

    version: int
    controllers: frozenset[str]  # v1: from the mount; v2: from cgroup.controllers
    mount_point: str
    base: str  # absolute dir of our own cgroup in it; ccw's parent goes beneath


@dataclass(frozen=True)
class CgroupLayout:
    """What this host offers: which hierarchy serves each resource."""

    hierarchies: tuple[Hierarchy, ...] = ()
    notes: tuple[str, ...] = ()

    def for_resource(self, resource: str) -> Hierarchy | None:
        """The hierarchy serving memory, pids, cpu (usage), share (CPU weight), io, freezer
        or kill (v2 first)."""
        v2 = self.unified
        if resource == "share":
            return v2 if v2 is not None and "cpu" in v2.controllers else self._v1("cpu")
        if resource == "kill":
            # A v2 hierarchy the exec joins for nothing else is left out when the v1
            # freezer can kill: joining v2 takes the global migration lock (see the essay).
            freezer = self._v1("freezer")
            if v2 is not None and (freezer is None or any(
                    self.for_resource(r) is v2 for r in ("memory", "pids", "cpu", "share", "io"))):
                return v2
            return freezer
        if resource == "cpu":
            if v2 is not None and "cpu" in v2.controllers:
                return v2
            return self._v1("cpuacct") or v2  # v2 cpu.stat works without the controller
        v2_name = {"io": "io"}.get(resource, resource)
        if v2 is not None and v2_name in v2.controllers:
            return v2
        return self._v1({"io": "blkio"}.get(resource, resource))

    @property
    def unified(self) -> Hierarchy | None:
        """The cgroup2 hierarchy, with or without controllers."""
        return next((h for h in self.hierarchies if h.version == 2), None)

    def _v1(self, controller: str) -> Hierarchy | None:
        return next((h for h in self.hierarchies if h.version == 1 and controller in h.controllers), None)


def _own_dir(mount: CgroupMount, own_path: str | None) -> str:
    # Our cgroup path is relative to the hierarchy root; the mount shows `mount.root` of it.
    if own_path is None:
        return mount.mount_point
    root = mount.root.rstrip("/")
    if root and not (own_path == root or own_path.startswith(root + "/")):
        return mount.mount_point  # our cgroup is outside what is mounted here
    rel = own_path[len(root) :].strip("/")
    return os.path.join(mount.mount_point, rel) if rel else mount.mount_point


def build_layout(
    mountinfo: str, proc_cgroups: str, self_cgroup: str, v2_controllers: dict[str, str]
) -> CgroupLayout:
    """Pure: the layout from mountinfo, /proc/cgroups, /proc/self/cgroup, and the text of
    cgroup.controllers for each cgroup2 mount point (key: mount point)."""
    enabled = {name for name, (_, on) in parse_proc_cgroups(proc_cgroups).items() if on}
    own = parse_self_cgroup(self_cgroup)
    hierarchies: list[Hierarchy] = []
    notes: list[str] = []
    seen: set[frozenset[str]] = set()
    for mount in cgroup_mounts(mountinfo):
        if mount.version == 2:
            if any(h.version == 2 for h in hierarchies):
                continue
            ctrls = frozenset(v2_controllers.get(mount.mount_point, "").split())
            own_v2 = own.get("")
            if own_v2 is not None and own_v2.endswith("/" + HELPER_LEAF):
                own_v2 = own_v2[: -len(HELPER_LEAF) - 1] or "/"  # enter_leaf moved us: the base is above
            hierarchies.append(Hierarchy(2, ctrls, mount.mount_point, _own_dir(mount, own_v2)))
            continue
        ctrls = frozenset(o for o in mount.options if o in enabled)
        wanted = ctrls & set(V1_WANTED)
        if not wanted or ctrls in seen:
            continue
        seen.add(ctrls)
        key = next((k for k in own if k and frozenset(k.split(",")) == ctrls), None)
        hierarchies.append(Hierarchy(1, ctrls, mount.mount_point, _own_dir(mount, own.get(key) if key else None)))
    if not hierarchies:
        notes.append("no cgroup filesystem is mounted")
    # A v1 controller that is also enabled on v2 cannot be: the kernel binds each to one.
    return CgroupLayout(tuple(hierarchies), tuple(notes))


def detect_layout() -> CgroupLayout:
    """Read the host's cgroup layout (see build_layout)."""

    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    table = read(mountinfo.PATH)
    v2 = {m.mount_point: read(os.path.join(_own_dir(m, None), "cgroup.controllers"))
          for m in cgroup_mounts(table) if m.version == 2}
    layout = build_layout(table, read("/proc/cgroups"), read("/proc/self/cgroup"), v2)
    # cgroup.controllers of *our* cgroup is what we may delegate further down.
    fixed = []
    for h in layout.hierarchies:
        if h.version == 2 and h.base != h.mount_point:
            h = Hierarchy(2, frozenset(read(os.path.join(h.base, "cgroup.controllers")).split()), h.mount_point, h.base)
        fixed.append(h)
    return CgroupLayout(tuple(fixed), layout.notes)


def enter_leaf(layout: CgroupLayout | None = None) -> str | None:
    """Move this process into ``<own v2 cgroup>/ccw-helper`` when it is alone in its cgroup.

    Returns the leaf, or None when nothing was moved (no v2 hierarchy, the root cgroup,
    other processes beside us, or a cgroup we may not write: execs then report why).
    """
    layout = layout or detect_layout()
    unified = layout.unified
    if unified is None or unified.base == unified.mount_point:
        return None
    if procs(unified.base) != [os.getpid()]:
        return None  # already in the leaf, or sharing the cgroup: moving would not help
    leaf = os.path.join(unified.base, HELPER_LEAF)
    try:
        make_dir(leaf)
        write_file(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
    except (OSError, CcwError):
        return None
    return leaf


def resources_worth_joining(layout: CgroupLayout) -> tuple[str, ...]:
    """The resources an exec joins a cgroup for (v1 blkio is left out: see exec_cgroup.py)."""
    io = layout.for_resource("io")
    wanted = ("memory", "pids", "cpu", "share", "kill")
    return wanted if io is None or io.version == 1 else (*wanted, "io")


def mechanisms(layout: CgroupLayout | None = None) -> dict[str, str | None]:
    """For hello/isolation: which hierarchy serves each resource, or None."""
    layout = layout or detect_layout()
    out: dict[str, str | None] = {}
    for res in ("memory", "pids", "cpu", "share", "io", "kill"):
        h = layout.for_resource(res)
        out[res] = None if h is None else f"cgroup v{h.version} {h.mount_point}"
    if "io" not in resources_worth_joining(layout):
        out["io"] = "the jail's wait4 rusage (block reads and writes of every jail process)"
    return out


def dirs_named(layout: CgroupLayout, name: str) -> Iterator[str]:
    """Every cgroup called ``name`` up to four levels deep in each hierarchy.

    ccw's parents live under our own cgroup, but a crashed helper may have lived in
    another one (e.g. a per-command cgroup), so the whole top of each tree is searched.
    """
    for hier in layout.hierarchies:
        stack = [(hier.mount_point, 0)]
        while stack:
            path, depth = stack.pop()
            try:
                entries = [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for entry in entries:
                if entry.name == name:
                    yield entry.path
                elif depth < 3:
                    stack.append((entry.path, depth + 1))


def can_create_child(base: str) -> bool:
    """Whether this process may make a cgroup below ``base`` (tried: made and removed)."""
    probe = os.path.join(base, f"ccw-doctor-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return True


# --------------------------------------------------------------------- cgroupfs files
def read_file(path: str) -> str:
    """The text of a cgroupfs file."""
    with open(path) as f:
        return f.read()


def write_file(path: str, value: str, hint: str = HINT) -> None:
    """Write ``value`` to a cgroupfs file; a refusal is a CcwError naming the file, with ``hint``."""
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as exc:
        raise from_oserror(exc, f"write {value!r} to", path, hint) from exc


def procs(cgroup_dir: str) -> list[int]:
    """The pids in a cgroup (none when it is gone)."""
    try:
        return [int(x) for x in read_file(os.path.join(cgroup_dir, "cgroup.procs")).split()]
    except OSError:
        return []


def wait_empty(cgroup_dir: str, timeout: float) -> bool:
    """Wait until no process is in the cgroup; False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while procs(cgroup_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def remove_dir(cgroup_dir: str) -> None:
    """rmdir an emptied cgroup, retrying for a second: a killed task leaves cgroup.procs a
    moment after the SIGKILL lands.  A cgroup already gone is fine."""
    for _ in range(500):
        try:
            os.rmdir(cgroup_dir)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise from_oserror(exc, "rmdir", cgroup_dir, HINT) from exc
            time.sleep(0.002)
    raise CcwError("INTERNAL", f"rmdir {cgroup_dir!r} failed: EBUSY after 1 s; processes left: {procs(cgroup_dir)}")


def make_dir(path: str) -> bool:
    """mkdir; True if created, False if it existed."""
    try:
        os.mkdir(path)
        return True
    except FileExistsError:
        return False


class ControlFiles:
    """A cgroup's control files, each opened once and kept open: read with ``pread`` at
    offset 0 (a cgroupfs file renders afresh from there), written with ``pwrite``.  An
    exec's limits and usage then cost one syscall per file instead of open, read, close.

    The descriptors are close-on-exec, and the jail's first child closes every helper
    descriptor before anything else runs (contain.py).
    """

    def __init__(self) -> None:
        self._fds: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()  # the cpu watcher and the exec's thread may both open

    def open_ahead(self, reads: Iterable[str], writes: Iterable[str] = ()) -> None:
        """Open these files now (those that exist), off the exec's path."""
        for paths, mode in ((reads, os.O_RDONLY), (writes, os.O_WRONLY)):
            for path in paths:
                with contextlib.suppress(OSError):
                    self._fd(path, mode)

    def _fd(self, path: str, mode: int) -> int:
        # One descriptor per direction: kernfs refuses to open a read-only file for
        # writing (cpu.stat, pids.events) and a write-only one for reading (cgroup.kill).
        fd = self._fds.get((path, mode))
        if fd is None:
            with self._lock:
                fd = self._fds.get((path, mode))
                if fd is None:
                    fd = self._fds[path, mode] = os.open(path, mode | os.O_CLOEXEC)
        return fd

    def read(self, path: str) -> str:
        """The file's whole text (OSError as ``read_file`` raises it)."""
        fd = self._fd(path, os.O_RDONLY)
        chunks: list[bytes] = []
        while chunk := os.pread(fd, 65536, sum(map(len, chunks))):
            chunks.append(chunk)
        return b"".join(chunks).decode()

    def write(self, path: str, value: str, hint: str = HINT) -> None:
        """Write ``value``; a refusal is a CcwError naming the file, with ``hint`` (as ``write_file``)."""
        try:
            os.pwrite(self._fd(path, os.O_WRONLY), value.encode(), 0)
        except OSError as exc:
            raise from_oserror(exc, f"write {value!r} to", path, hint) from exc

    def close(self) -> None:
        """Close every descriptor; the object may be used again (it reopens)."""
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
