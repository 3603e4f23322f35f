"""Whose is a socket: each service of an egress capsule gets a cgroup v2 id of its own, so
that the front end can tell its connections from the exec's.

All runs of a capsule (one exec, its services) share one network namespace
(capsule_nets.py), and an egress capsule's every way out is the front end's proxy, which
sees only the jail's address and port: every run of the capsule has the same address.
What the kernel does keep, per socket, is who made it:

- Each socket holds the cgroup v2 of the task that created it (``sk_cgrp_data``, set by
  ``cgroup_sk_alloc`` at creation, never changed by a later move of the task, kept
  through ``SCM_RIGHTS``).  Since 5.15 that pointer is kept apart from the v1 net_cls
  class id, so it is there on hybrid hosts too, and with no v2 controller at all.
- sock_diag reports it: the reply to an exact lookup (egress/peer.py's essay) carries
  ``INET_DIAG_CGROUP_ID`` (attribute 21, a u64) without being asked for it (``ext``
  0), and the id is the inode number of the cgroup's directory in the cgroup2 mount
  (``cgroup_id`` is the kernfs node id, which is the inode).  Tried on 6.18: a socket
  made by a process in ``unified/x`` reports x's inode; one made in the root reports 1.
- So a run is named by its socket only if it has a v2 cgroup of its own.  On a pure v2
  host every exec and service has one.  On a hybrid host with an empty cgroup2 (the CI
  VM) an exec joins none: joining v2 takes the kernel's global migration lock
  (exec_cgroup.py's essay), measured here at 5 to 16 ms a join (median 12.6 ms of 40 in
  a row), a third of an exec.  A *service* pays that once per start, against the
  seconds a server takes to come up, so a service of an egress capsule joins a v2 cgroup
  made for it (``join_unified``); an exec stays where it is, and a socket whose cgroup is
  no service's is the exec's.  (Writing "0" to ``cgroup.threads`` of a *threaded* child
  moves one thread without the lock, 0.6 ms, but it would make the helper's own cgroup a
  threaded domain, which no v2 controller could then use below it: not done.)
- A rootless helper without a delegated v2 subtree cannot make the cgroup: its services
  have no id (``cgroup_id`` None), and the front end counts their connections per exec
  window, as before, and says so in the service's record.

The helper answers ``net_runs`` with the ids of the capsule's services and a sock_diag
socket made inside the capsule's namespace (capsule_nets.py ``diag_socket``): the front
end asks the kernel itself, per connection, with no round trip to the helper.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Protocol

from sandbox import services
from sandbox.cgroups import make_dir
from sandbox.errors import CcwError
from sandbox.exec_cgroup import OWNER_SEP, PARENT_NAME

if TYPE_CHECKING:
    from sandbox.capsule_nets import Nets
    from sandbox.exec_cgroup import ExecCgroup
    from sandbox.meta import Capsule
    from sandbox.replies import NetOpenReply


def join_unified(cgroup: ExecCgroup) -> str | None:
    """Give the run a cgroup v2 directory of its own (its launcher moves in with the others,
    through ``entry_files``); None once it has one, else why it cannot."""
    unified = cgroup.layout.unified
    if unified is None:
        return "this host has no cgroup2 mount"
    if unified in cgroup.dirs:
        return None
    parent = os.path.join(unified.base, PARENT_NAME)
    path = os.path.join(parent, f"{cgroup.name}{OWNER_SEP}{os.getpid()}")
    try:
        make_dir(parent)
        if not make_dir(path):
            return f"cgroup {path} already exists"
    except (OSError, CcwError) as exc:  # a rootless helper without a delegated v2 subtree
        return f"mkdir {path} failed: {exc}"
    cgroup.dirs[unified] = path
    return None


def cgroup_id(cgroup: ExecCgroup | None) -> int | None:
    """The run's cgroup v2 id (its directory's inode), None if it has no v2 cgroup."""
    if cgroup is None or cgroup.layout.unified is None:
        return None
    path = cgroup.dirs.get(cgroup.layout.unified)
    if path is None:
        return None
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def service_ids(capsule: Capsule) -> dict[str, int | None]:
    """Each running service of the capsule by name: its cgroup v2 id, None if it has none
    (yet: the id is known once its jail is spawned)."""
    return {run.name: cgroup_id(run.cgroup) for run in services.running(capsule) if run.service is not None}


class _Manager(Protocol):
    """What ``with_runs`` asks of the capsule manager (manager.py ``CapsuleManager``)."""

    nets: Nets

    def _get(self, capsule_id: Any, caller_uid: int) -> Capsule: ...


def with_runs(manager: _Manager, capsule_id: str, caller_uid: int, reply: NetOpenReply,
              fds: list[int]) -> tuple[NetOpenReply, list[int]]:
    """``net_open``'s reply and descriptors (already the caller's capsule's, checked) with
    its services' cgroup v2 ids and a sock_diag socket in its jail's namespace, fourth."""
    try:
        capsule = manager._get(capsule_id, caller_uid)
        diag = manager.nets.diag_socket(capsule_id, capsule.spec.network)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return dataclasses.replace(reply, services=service_ids(capsule)), [*fds, diag.detach()]
