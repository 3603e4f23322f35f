"""CapsuleManager: every capsule of this helper, and each operation on one.

A capsule is one overlay superblock (see overlay.py) plus a few dirs under
``<state_dir>/capsules/<id>/``: ``upper`` and ``work`` (overlay), ``merged`` (the mount
point), ``tmp`` and ``home`` (the jail's /tmp and $HOME, kept across execs) and
``meta.json`` (who owns it and how to mount it again; meta.py).  With a disk limit (the
default when the helper is privileged, see disk.py) ``upper``, ``work``, ``tmp`` and
``home`` live on the capsule's own ext4 disk, ``disk.img`` mounted at ``disk/``, so that
nothing a command writes can outgrow it.  The manager is the only writer of
``capsules/``: it keeps the capsules by id under one lock and decides; its mounts are
made and taken down by capsule_mounts.py, and recovery.py takes back what a dead
helper left.  Choices made here:

* **Ids** are ``cap_<13-digit ms>_<8 hex>`` (inside checks.py's one id grammar); within
  one millisecond the hex part is made to increase, so ids sort by creation within a
  helper's life.
* **Exec**, fork and destroy wait for the last exec's end (jail_end.py); services run
  beside the exec (services.py); one network namespace per capsule (capsule_nets.py).
* **Authorisation** is access.py's: every method checks the caller's uid and, for
  create, that it may reach the directories (see there).
* **Fork** stacks the child on its parent's layers, and the parent is frozen (read-only,
  capsule_mounts.py) while it has forks; exec on it is refused.  It thaws when its last
  fork is destroyed.  ``changes`` of a fork are relative to the base, i.e. they include
  the parent's changes: what promoting the fork would apply.  ``destroy`` refuses a
  capsule that still has forks.  A fork with ``donors`` stacks their own layers too
  (fork_layers.py), and each donor is held as the parent is.
* **The state dir inside the workspace** is allowed (access.py), but such capsules
  cannot be forked: overlayfs refuses (ELOOP) a lower layer inside another lower
  layer, and a fork's lowers would be the parent's upper inside the workspace; fork
  says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sandbox import (
    access,
    capsule_mounts,
    capsule_nets,
    disk,
    egress,
    execution,
    exposed,
    fork_layers,
    gitdirs,
    in_force,
    jail_end,
    kernel_ports,
    namespaces,
    recovery,
    services,
    upperscan,
)
from sandbox.access import check_uid_gid, inside
from sandbox.checks import check_capsule_id
from sandbox.errors import CcwError
from sandbox.meta import Capsule, now_iso
from sandbox.ops import ExecRequest, NetForwardRequest
from sandbox.replies import (
    ChangesReply,
    CreateReply,
    DestroyReply,
    ExecProgress,
    ExecReply,
    ForkReply,
    FreezeReply,
    ListReply,
    NetConnectReply,
    NetForwardReply,
    NetOpenReply,
    RunReadsReply,
    SignalReply,
)
from sandbox.spec import CapsuleSpec


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
        self.kits = egress.Kits()
        self.nets = capsule_nets.Nets(self.kits)
        self.kernel_ports = kernel_ports.KernelPorts(rootless)
        with contextlib.suppress(FileExistsError):
            os.makedirs(self.capsules_dir, mode=0o700)

    # --- ids, lookup, authorisation ------------------------------------------------

    def _new_id(self) -> str:
        """A new id, of the form recovery.ID_RE knows as this helper's."""
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
        check_capsule_id(capsule_id)
        with self._lock:
            capsule = self._capsules.get(capsule_id)
        if capsule is None:
            raise CcwError("NOT_FOUND", f"capsule {capsule_id} not found; list your capsules or create one",
                           {"capsule_id": capsule_id})
        access.check_owner(capsule, caller_uid)
        return capsule

    # --- create / fork -------------------------------------------------------------

    def create(self, owner_uid: int, owner_gid: int, spec: CapsuleSpec) -> CreateReply:
        """Mount a capsule over the spec's workspace (or over its base, shown at the workspace's path).

        The spec was checked when the request was read (sandbox/ops.py); what depends on
        the host (the directories, the caller's access to them) is checked here.
        """
        check_uid_gid(owner_uid, owner_gid)
        workspace = access.check_dir_arg("workspace", spec.workspace, self.state_dir)
        base = spec.given_base
        if base is not None:
            base = access.check_dir_arg("base", base, self.state_dir, allow_state=True)
        spec = dataclasses.replace(spec, workspace=workspace, given_base=base)
        # Exposed dirs resolved and checked against the caller; each exec checks them again.
        spec = dataclasses.replace(spec, expose=exposed.check(spec.expose, workspace, owner_uid, owner_gid))
        disk_mb = self._disk_size(spec.limits.disk_mb)
        with (access.pinned_lower(workspace, base, owner_uid, owner_gid, self.state_dir) as (lower_fd, lower_real),
              gitdirs.pinned(spec.gitdirs, workspace, lower_real, owner_uid, owner_gid, self.state_dir) as held):
            meta = {
                "owner_uid": owner_uid,
                "owner_gid": owner_gid,
                "lowers": [lower_real],
                "ancestors": [],
                "parent": None,
                "disk_mb": disk_mb,
                **({"gitdirs": [[real] for _, real in held]} if held else {}),
            }
            capsule = self._materialise(meta, spec, os.fstat(lower_fd), mount_lowers=[f"/proc/self/fd/{lower_fd}"],
                                        gitdir_mounts=[(os.fstat(fd), [f"/proc/self/fd/{fd}"]) for fd, _ in held])
        return CreateReply(**self._describe(capsule))

    def _disk_size(self, requested: int | None) -> int | None:
        """The disk size for a new capsule: the request, else the default; None for no disk."""
        if self.disks is None:
            if requested is not None:
                raise CcwError("UNSUPPORTED", f"this helper cannot give capsules a disk limit: {self.disk_reason}; "
                               "create the capsule without limits.disk_mb")
            return None
        return requested if requested is not None else self.disks.default_mb

    def fork(self, capsule_id: str, caller_uid: int, caller_gid: int, donors: Sequence[str] = ()) -> ForkReply:
        """A child capsule seeing its parent's view, each donor's own layers stacked above it (top
        first, fork_layers.py); the parent and the donors are frozen while it exists."""
        check_uid_gid(caller_uid, caller_gid)
        parent = self._get(capsule_id, caller_uid)
        givers = [self._get(donor, caller_uid) for donor in donors]
        if any(inside(parent.root, lower) for lower in parent.base_lowers):
            # overlayfs refuses (ELOOP) a lower layer that lies inside another lower layer.
            raise CcwError("UNSUPPORTED", f"capsule {capsule_id} cannot be forked: the helper's state dir "
                           f"{self.state_dir!r} lies inside its workspace; run the helper with a state dir "
                           "outside the workspace (CCW_STATE_DIR)")
        lowers, above = fork_layers.stacked(parent, givers)
        held = [parent, *givers]
        with jail_end.after_ending(self._lock, *held):
            for one in held:
                capsule_mounts.ensure_mounted(one, self._capsules, self.rootless)
            fork_layers.hold(held)  # frozen while the child is built
        child: Capsule | None = None
        try:
            meta = dict(parent.meta)
            meta.update(
                lowers=lowers,
                ancestors=[parent.capsule_id, *parent.ancestors],
                parent=parent.capsule_id,
                donors=list(donors),
                layers_above_base=above,
                disk_mb=self._disk_size(parent.disk_mb),
            )
            shown = gitdirs.fork_mounts(parent)
            meta.update({"gitdirs": [stack for _, stack in shown]} if shown else {})
            st = os.stat(parent.path("merged"))
            child = self._materialise(meta, parent.spec, st, mount_lowers=meta["lowers"], gitdir_mounts=shown)
        finally:
            with self._lock:
                fork_layers.release(held, None if child is None else child.capsule_id)
        return ForkReply(**self._describe(child), parent=parent.capsule_id)

    def _materialise(self, meta: dict[str, Any], spec: CapsuleSpec, root_st: os.stat_result,
                     mount_lowers: list[str],
                     gitdir_mounts: list[tuple[os.stat_result, list[str]]]) -> Capsule:
        """A new capsule under a new id, built and mounted (capsule_mounts.materialise), then registered."""
        meta = dict(meta, capsule_id=self._new_id(), created_at=now_iso())
        capsule = capsule_mounts.materialise(self.capsules_dir, meta, spec, root_st, mount_lowers, gitdir_mounts,
                                             self.disks, self.rootless)
        with self._lock:
            self._capsules[capsule.capsule_id] = capsule
        return capsule

    def _describe(self, capsule: Capsule) -> dict[str, Any]:
        """The fields of a create or fork reply for a capsule just made."""
        return {
            "capsule_id": capsule.capsule_id,
            "mount": capsule.path("merged"),
            "workspace": capsule.spec.workspace,
            "created_at": capsule.meta["created_at"],
            "clock": now_iso(capsule.spec.clock_offset_sec),
            "isolation": self.isolation(capsule),
        }

    def isolation(self, capsule: Capsule) -> dict[str, Any]:
        """The mechanisms in force for a capsule (helper-wide ones probed once)."""
        if self._isolation is None:
            self._isolation = in_force.isolation(self.rootless)
        filesystem: dict[str, Any] = {"overlayfs": True, "userxattr": self.rootless,
                                      "frozen_base": capsule.spec.given_base is not None,
                                      "disk_limit_mb": capsule.disk_mb}
        if capsule.spec.gitdirs:
            filesystem["gitdirs"] = gitdirs.describe(capsule)
        if capsule.disk_mb is None:
            filesystem["disk_limit_unavailable"] = self.disk_reason or "the capsule was made without a disk"
        return {
            "filesystem": filesystem,
            "network": capsule.spec.network,
            "network_mechanism": egress.MECHANISM if capsule.spec.network == "egress" else egress.NO_MECHANISM,
            "clock_offset_sec": capsule.spec.clock_offset_sec,
            **self._isolation,
        }

    # --- queries -------------------------------------------------------------------

    def changes(self, capsule_id: str, caller_uid: int, leave_not_utf8: bool = False,
                unlisted: bool = False, mtimes: bool = False) -> ChangesReply:
        """The capsule's changes against its base, sorted by path (see upperscan.collect_changes);
        ``leave_not_utf8``: those naming something that is not UTF-8 left out, not refused;
        ``unlisted``: with what its uppers hold that no change names (sorted too); ``mtimes``: files'."""
        capsule = self._get(capsule_id, caller_uid)
        with self._lock:
            capsule_mounts.ensure_disks(capsule, self._capsules, self.rootless)
        uppers = [capsule.path("upper"), *capsule.lowers[: capsule.layers_above_base]]
        held: list[str] | None = [] if unlisted else None
        found = upperscan.collect_changes(uppers, capsule.base_lowers, held, mtimes)
        shown = gitdirs.changes(capsule) if capsule.spec.gitdirs else None
        if leave_not_utf8:
            return ChangesReply.carried(tuple(found), shown)
        return ChangesReply(tuple(found), shown, unlisted=None if held is None else tuple(sorted(held)))

    def open_root(self, capsule_id: str, caller_uid: int) -> int:
        """An O_PATH|O_DIRECTORY descriptor of the merged view; the caller closes it."""
        capsule = self._get(capsule_id, caller_uid)
        with self._lock:
            capsule_mounts.ensure_mounted(capsule, self._capsules, self.rootless)
        merged = capsule.path("merged")
        fd = os.open(merged, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        if os.fstat(fd).st_dev == os.stat(capsule.root).st_dev:
            os.close(fd)
            raise CcwError("INTERNAL", f"capsule {capsule_id}'s overlay is not mounted; destroy and recreate it")
        return fd

    def net_open(self, capsule_id: str, caller_uid: int) -> tuple[NetOpenReply, list[int]]:
        """An "egress" capsule's kit (made on first use): the reply and the descriptors to pass."""
        capsule = self._get(capsule_id, caller_uid)
        if capsule.spec.network != "egress":
            raise CcwError("INVALID_ARGUMENT", f"capsule {capsule_id}'s network is {capsule.spec.network}: it has "
                           "no way out to open; create the capsule with an allowlist", {"capsule_id": capsule_id})
        fds = self.kits.open(capsule_id)
        with self._lock:
            gone = capsule_id not in self._capsules
        if gone:  # destroyed while its kit was being made
            self.kits.close(capsule_id)
            for fd in fds:
                os.close(fd)
            raise CcwError("NOT_FOUND", f"capsule {capsule_id} was destroyed", {"capsule_id": capsule_id})
        return egress.REPLY, fds

    def net_connect(self, capsule_id: str, port: int, caller_uid: int, spares: int | None = None,
                    v6: bool = False) -> tuple[NetConnectReply, list[int]]:
        """A socket connected to ``port`` on the capsule's loopback, or ``spares`` unconnected (capsule_nets.py)."""
        return self.nets.passed(capsule_id, self._get(capsule_id, caller_uid).spec.network, port, spares, v6)

    def net_forward(self, request: NetForwardRequest, caller_uid: int, caller_pid: int) -> NetForwardReply:
        """A forwarded port's kernel path: open, close or count (kernel_ports.py)."""
        capsule_id, host_port = request.capsule_id, request.host_port
        capsule = self._get(capsule_id, caller_uid)
        if request.action == "close":
            return NetForwardReply(host_port, not self.kernel_ports.close(capsule_id, host_port), 0)
        if request.action == "count":
            counted = self.kernel_ports.connections(capsule_id, host_port)
            return NetForwardReply(host_port, counted is not None, counted or 0)
        assert request.listener is not None
        if kernel_ports.held_port(request.listener) != host_port:
            raise CcwError("INVALID_ARGUMENT", f"the listening socket sent is not on host port {host_port}",
                           {"host_port": host_port})
        if not self.kernel_ports.rootless and not namespaces.socket_in_own_net_namespace(request.listener):
            # Rules made here would lead nothing: the owner's connections never pass this namespace.
            raise CcwError("UNSUPPORTED", "this helper runs in a network namespace of its own, not the front "
                           "end's (systemd's PrivateNetwork=yes); the forward relays in user space")
        netns = self.nets.descriptor(capsule_id, capsule.spec.network)
        try:
            self.kernel_ports.open(capsule_id, netns, request.port, host_port, caller_uid, caller_pid,
                                  request.listener)
        finally:
            os.close(netns)
        return NetForwardReply(host_port, True, 0)

    def list(self, caller_uid: int) -> ListReply:
        """The caller's own capsules, sorted by id (= creation)."""
        with self._lock:
            own = [c.summary() for c in self._capsules.values() if c.meta["owner_uid"] == caller_uid]
        return ListReply(tuple(sorted(own, key=lambda c: c.capsule_id)))

    # --- destroy / recover ---------------------------------------------------------

    def destroy(self, capsule_id: str, caller_uid: int) -> DestroyReply:
        """Unmount (lazily if busy) and delete a capsule without forks."""
        capsule = self._get(capsule_id, caller_uid)
        with self._lock:
            services.check_destroyable(capsule)
            stopping = services.kill_all(capsule)
        for run in stopping:  # nothing of a destroyed capsule runs on (services.py)
            run.wait_ended(services.STOP_WAIT_S)
        with jail_end.after_ending(self._lock, capsule):
            services.check_destroyable(capsule)  # again: an exec or a fork may have come meanwhile
            self._capsules.pop(capsule_id, None)
            under = [self._capsules[one] for one in [capsule.meta["parent"], *capsule.donors] if one in self._capsules]
        self.kernel_ports.close_capsule(capsule_id)
        self.kits.close(capsule_id)
        self.nets.close(capsule_id)
        capsule_mounts.remove(self.capsules_dir, capsule.root, capsule_id)
        with self._lock:
            for one in under:  # its parent and donors
                one.children.discard(capsule_id)
                if not one.children and one.mounted:
                    capsule_mounts.set_frozen(one, False)
        return DestroyReply(capsule_id, destroyed=True)

    def recover(self) -> dict[str, Any]:
        """At start: detach stale mounts, delete half-made capsules, re-register the rest (recovery.py).
        Also starts filling the disk pool, and makes a spare egress kit if any capsule is "egress"."""
        found, removed = recovery.recover_capsules(self.capsules_dir, self.rootless)
        with self._lock:
            self._capsules = found
        if any(capsule.spec.network == "egress" for capsule in found.values()):
            self.kits.prepare()  # their first net_open after this restart finds a kit ready
        stale_cgroups = execution.cleanup_stale_cgroups()
        if not self.rootless:
            kernel_ports.sweep()  # dead helpers' forwarded ports' links, left unfiltered
        if self.disks is not None:
            self.disks.start()  # so that the first create finds a disk ready
        return {"capsules": sorted(found), "removed": removed, "cgroups_removed": stale_cgroups}

    # --- exec ------------------------------------------------------------------------

    def exec(self, request: ExecRequest, caller_uid: int, caller_gid: int,
             on_progress: Callable[[ExecProgress], None] | None = None) -> ExecReply:
        """Run the request's argv in a fresh jail over its capsule; output, usage and touched files.

        The request was checked when it was read (sandbox/ops.py); its descriptor, if any, is
        checked here, what depends on the capsule by ``execution.run``.  ``on_progress``
        receives the jail's progress reports about every ``request.progress_ms`` while the
        command runs.  A service (``request.service``) runs beside the capsule's exec and
        other services (services.py); an exec runs alone among execs.
        """
        check_uid_gid(caller_uid, caller_gid)
        capsule_id = request.capsule_id
        capsule = self._get(capsule_id, caller_uid)
        if request.stdio == "stdin":
            access.check_stdin(request.tty_fd)
        else:
            access.check_terminal(request.tty_fd, caller_uid)  # None: pipes, nothing to check
        # The capsule's one network namespace (capsule_nets.py): refused, before anything
        # starts, for an "egress" capsule without net_open.
        net_fd = self.nets.descriptor(capsule_id, capsule.spec.network)
        try:
            # An exec sets up after the last one's end; a service beside it.
            with jail_end.after_ending(self._lock, capsule) if request.service is None else self._lock:
                services.admit(capsule, request)
                capsule_mounts.ensure_mounted(capsule, self._capsules, self.rootless)
                self._exec_count += 1
                run = services.begin(capsule, request, f"{capsule_id}.{self._exec_count}")
            try:
                on_ending = capsule.ended_by if request.service is None else run.ended_by
                return execution.run(capsule, request, run.exec_name, caller_uid, caller_gid, on_progress=on_progress,
                                     net_fd=net_fd, on_ending=on_ending, on_running=run.track)
            finally:
                with self._lock:
                    services.finish(capsule, run)
        finally:
            os.close(net_fd)

    def signal(self, capsule_id: str, service: str, signame: str, caller_uid: int) -> SignalReply:
        """Signal one of the capsule's running services (services.py)."""
        with self._lock:
            return services.signal(self._get(capsule_id, caller_uid), service, signame)

    def run_reads(self, capsule_id: str, service: str, caller_uid: int) -> RunReadsReply:
        """What one of the capsule's running services has touched so far (services.py)."""
        return services.reads(self._get(capsule_id, caller_uid), service, self._lock)

    def freeze(self, capsule_id: str, frozen: bool, caller_uid: int) -> FreezeReply:
        """Pause (freeze) or resume every run of the capsule (services.py)."""
        with self._lock:
            return services.freeze(self._get(capsule_id, caller_uid), frozen)

    def close(self) -> None:
        """Release what the helper holds beyond the state dir: the capsules' networks (at shutdown)."""
        self.kernel_ports.close_all()
        self.kits.close_all()
        self.nets.close_all()
