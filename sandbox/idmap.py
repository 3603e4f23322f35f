"""Idmapped mounts: the host's trees, as a root caller's jail sees them, out of its capabilities' reach.

The problem (issue 35).  A root caller's jail keeps CAP_CHOWN, CAP_DAC_OVERRIDE,
CAP_FOWNER and CAP_FSETID (rootcaps.py), so that it writes where the host's root would in
the capsule's own trees: a checkout owned by another uid, an sdist unpacked with its
owners.  Held in the host's user namespace, a capability passes the mode bits of every
inode the jail can see, not only the capsule's: another user's 0600 file in a 0700
directory under /opt, a token in an exposed toolchain dir, a service's private config
under /etc.  The agent in the capsule is not the root caller; it is what the caller
wants contained.  So the host's trees are shown to such a jail through idmapped mounts
that map only root, and the four reach the capsule's trees alone.

Some facts about idmapped mounts, as the jail uses them:

- A capability passes a file's mode bits (``capable_wrt_inode_uidgid``) only when the
  file's owner *and* group are both mapped in the capable process's user namespace, as
  the mount shows them.  An idmapped mount (``mount_setattr`` with
  ``MOUNT_ATTR_IDMAP`` and a user namespace's descriptor, Linux 5.12) shows each owner
  through that namespace's maps: an id it does not map shows as the overflow id
  (65534), is mapped nowhere, and no capability passes its bits; the check falls back
  to "other".  Through a namespace that maps only uid 0 and gid 0, root's files stay
  root's, and every other user's file keeps the protection of its mode bits, whatever
  the jail holds.  The capsule's own trees (the workspace's view, its git dirs, /tmp,
  $HOME) are shown as they are, and the four keep their full reach there.
- Measured on 6.18: the helper's own root, with every capability, is refused another
  uid's 0600 file through such a mount (EACCES), and so is an overlay whose lower layer
  is one (how the jail's /etc is made: mounttree.py).
- Only a detached mount can be idmapped (``open_tree(OPEN_TREE_CLONE)``, before it is
  attached anywhere), recursively with ``AT_RECURSIVE``, and every filesystem in it must
  allow it (ext4, xfs, btrfs, tmpfs since 6.3, vfat and others do; NFS, FUSE, proc and
  sysfs do not): a refusal is EINVAL, for the whole tree.  So the trees are idmapped where
  the helper makes them detached: the root tree built ahead (``mounts.build_root``: the
  system dirs, /etc's lower layer and the host's mounts inside /etc) and the host binds
  cloned for each exec (``mounts.detach_sources``: exposed toolchains, the helper's
  interpreter).  /dev's few nodes, /proc and /sys are root's (or the jail's own) and stay
  as they are.  A kernel that cannot build trees detached (before 6.15, where ccw-jail
  builds its root in place) has none of this.
- A user namespace's maps are written once, by a process of the parent namespace that
  holds CAP_SETUID and CAP_SETGID, and a multi-threaded process cannot unshare one.  So
  ``ccw-jail userns`` unshares it and holds it while the helper writes ``0 0 1`` to both
  maps and opens it (``jail_launcher.user_namespace``, 1.4 ms, once per helper).  No
  process lives in it: the helper's descriptor keeps it.
- What it costs, measured on the 2-core VM (medians): a host bind's clone 25 us plain,
  33 us idmapped, per exec; the root tree 1.1-1.4 ms either way, built ahead off the
  exec's path; /bin/true in a root caller's jail 0.99-1.03x the same jail with the host
  trees as they are, and 0.54-0.58x bwrap (bench/run.py capsule).  No mount table is
  copied: the jail still copies the one-mount launch namespace (mounts.py).
- An idmapped mount changes how owners are shown and checked, never what is stored: the
  host's trees are read-only in the jail anyway.  In them ``ls -l`` shows other users'
  files as 65534, as the rootless helper's jails always have.

What this module decides: ``host_trees`` gives that namespace once every piece is there
(the privileged helper's initial user namespace, the launch namespace, and a root tree
built idmapped once as the proof), else None, with ``why_not``.  supervise.py then gives
a root caller's jail an idmapped root tree and idmapped host binds, and contain.prepare
gives it the four only then (rootcaps.kept_for).  Without it a root caller's jail keeps
no capability, as before issue 25: a foreign-owned checkout is read-only to it, and the
capsule's ``isolation`` says why.
"""

from __future__ import annotations

import logging
import os
import threading

from sandbox import jail_launcher, mounts, mounttree, namespaces, rootcaps
from sandbox.errors import CcwError

log = logging.getLogger(__name__)

ROOT_ONLY = "0 0 1"  # the uid and gid maps of the namespace the host's trees are shown through

_lock = threading.Lock()
_made: list[tuple[int | None, str]] = []  # once asked: (its descriptor, kept for the helper's life; or None, why)


def host_trees() -> int | None:
    """The user namespace the host's trees are shown through to a root caller's jail, or None."""
    with _lock:
        if not _made:
            _made.append(_make())
        return _made[0][0]


def for_caller(uid: int) -> int | None:
    """The namespace a jail of ``uid`` is shown the host's trees through: a root caller's that
    keeps the four (rootcaps.py), None for every other jail (it sees them as they are)."""
    if not rootcaps.kept_for(uid, namespaces.read_id_maps()[0], host_trees_mapped=True):
        return None
    return host_trees()


def check_exposed(fd: int, path: str) -> None:
    """UNSUPPORTED unless the directory at ``fd`` can be shown idmapped: refused at create, not at every exec."""
    mapping = host_trees()
    if mapping is None:
        return
    try:
        os.close(mounttree.clone("", 0, dirfd=fd, idmap=mapping))
    except OSError as exc:
        raise CcwError("UNSUPPORTED", (
            f"expose {path!r}: a root caller's jail is shown every host directory through an idmapped mount, so "
            f"that its file capabilities reach no other user's files there, and this one's filesystem refused "
            f"one ({exc.strerror}; NFS and FUSE do). Expose a copy on a local filesystem, leave it out of expose "
            "(auto_expose: false), or run ccw as the user who owns it"), {"argument": "expose", "path": path}) from exc


def why_not() -> str | None:
    """Why ``host_trees`` is None (None once it was made, or before it was asked)."""
    with _lock:
        return _made[0][1] if _made and _made[0][0] is None else None


def _make() -> tuple[int | None, str]:
    if not namespaces.is_initial_user_namespace(namespaces.read_id_maps()[0]):
        return None, "a rootless helper's jail holds no capability: nothing to scope"
    if mounts.launch_namespace() is None:
        return None, "the helper could not make its launch mount namespace (mounts.launch_namespace)"
    try:
        made = jail_launcher.user_namespace(ROOT_ONLY, ROOT_ONLY)
    except (OSError, CcwError) as exc:
        return None, f"no user namespace for idmapped mounts: {exc}"
    try:
        os.close(mounts.build_root(made))  # the proof: every system tree takes the idmap
    except OSError as exc:
        os.close(made)
        return None, (f"the host's system trees cannot be idmapped ({exc.strerror or exc}): a kernel before 6.15, "
                      "or a filesystem without idmapped mounts (NFS, FUSE)")
    return made, ""


def spare_root() -> int | None:
    """A detached root tree for a later root caller's jail, its host trees idmapped (None: none can be made)."""
    mapping = host_trees()
    if mapping is None:
        return None
    try:
        return mounts.build_root(mapping)
    except OSError as exc:
        log.warning("could not build an idmapped spare root tree: %s", exc)
        return None


def mechanisms() -> dict[str, object]:
    """What ``hello`` and a capsule's ``isolation`` say of the host's trees."""
    if host_trees() is None:
        return {"idmapped": False, "reason": why_not()}
    return {"idmapped": True, "maps": "uid 0 and gid 0 only",
            "trees": "system dirs, /etc, exposed toolchains, the helper's interpreter; not the capsule's own",
            "effect": "a root caller's file capabilities pass no other user's mode bits outside the capsule's trees"}
