"""The file-ownership capabilities a root caller's jail keeps, over its capsule's trees only, and why that is safe.

The problem (issue 25).  CI containers run as root on a checkout owned by the runner's
uid, and ``tar`` run by root keeps an sdist's owners, so a root caller's workspace is
often owned by some other uid.  On the host, root writes there anyway: its
CAP_DAC_OVERRIDE passes every permission check.  A jail with no capabilities is uid 0
without that power: it owns the system files but not the workspace, so ``echo b >
pkg/new.txt`` is EACCES, a C extension's build cannot create its ``.so``, Python
silently skips writing ``.pyc`` files, and a capsule fails where the host succeeds.
Worse, the failure looks like the base's own (deltamin refuses: "the base without any
change already fails").

The choice.  When the jail's uid is 0 *in the initial user namespace* (a root caller of
the privileged helper) and the helper can show it the host's trees idmapped
(sandbox/idmap.py), its init keeps four capabilities in its bounding, permitted and
effective sets and gives them to every command it spawns; any other jail keeps none, as
before:

- CAP_CHOWN (chown to any uid/gid), CAP_DAC_OVERRIDE (read, write and search past the
  mode bits; execute needs one x bit), CAP_FOWNER (chmod, utimes and the like on files
  root does not own; delete in sticky dirs), CAP_FSETID (keep set-group-ID when the
  group is not root's).  These are four of Docker's fourteen default capabilities,
  exactly those that make uid 0 the owner of every file it can reach: what a root
  caller has on the host over the same files.
- Not CAP_DAC_READ_SEARCH: its only power past DAC_OVERRIDE is ``open_by_handle_at``
  (Docker's "shocker" escape, which opens any inode of a filesystem whatever the mount
  tree shows).  Not CAP_SYS_ADMIN (mounts, FIFREEZE on the host's filesystem, and a
  hundred more), CAP_MKNOD, CAP_SETUID/SETGID (becoming another user), CAP_SYS_PTRACE
  (another process's /proc/PID/root, fd, mem), CAP_NET_*, CAP_SETFCAP, CAP_SETPCAP,
  CAP_LINUX_IMMUTABLE, CAP_SYS_CHROOT, CAP_KILL or anything else.

How they reach the command.  ``no_new_privs`` (set before the spawn) stops an exec from
gaining what its caller lacks: the kernel caps the new permitted set at the old one.
So the init keeps the four in its permitted and effective sets (capset) and in the
bounding set; uid 0's exec then computes permitted = bounding = the four (root's exec
rule, no SECBIT_NOROOT), which no_new_privs does not see as a gain, and effective =
permitted.  Inheritable and ambient stay empty.  Without CAP_SETUID and CAP_SETGID no
process of the jail can become another user, so every process has them and no more.

Why they reach only the capsule's trees (issue 35).  A capability held in the host's user
namespace passes the mode bits of every inode the jail can see, so the four alone would
pass those of every tree the jail shows: another user's 0600 file under /opt, a token in
an exposed toolchain dir, a service's private config under /etc.  The agent in the capsule
is not the root caller but what the caller wants contained, so the power must stop at
the capsule's own trees.  A capability passes a file's mode bits only when the file's
owner and group are both mapped in the process's user namespace *as its mount shows
them*; the jail shows every host tree (the system dirs, /etc's lower layer, exposed
toolchains, the helper's interpreter) through an idmapped mount that maps only uid and
gid 0 (idmap.py's essay), so there another user's file shows as 65534 and falls back to
its "other" bits, whatever the jail holds.  Other choices, weighed:

- a user namespace for the jail mapping root and the workspace's owners would scope by
  *uid*, not by tree: the owner's private files elsewhere (its toolchain dirs, its files
  under /opt) would stay open, ``chown`` to any unmapped id (``tar`` as root keeps an
  archive's owners) would fail with EINVAL, and the owners would have to be found by a
  walk of the whole workspace at create;
- idmapping the capsule's own trees instead cannot give several owners' files to one
  uid 0.

What the four then change is measured against what uid 0 without them already had: uid 0
owns nearly every file of the host's trees, and reads them by the owner bits as before.
The increment is files of other uids, and root-owned files whose mode denies root, in:

- the capsule's own trees (the workspace view, git dirs outside it, /tmp, $HOME):
  copy-on-write layers and directories in the capsule's state, over files the host's
  root could write anyway.  Writes there never reach the host tree but through
  promotion, which refuses set-id bits and device nodes (mcp_server/core/hazards.py);
- root's own files of the host's trees whose mode denies root (rare: mode 0000 files);
  every other user's file there is shown unmapped.  Writing any of them is EROFS, which
  no DAC capability passes; changing a mount needs CAP_SYS_ADMIN and the mount
  syscalls, which seccomp denies too;
- the masked secrets: /etc/shadow and friends are empty mode-0000 files of a
  read-only tmpfs in an /etc overlay (mounts.py), so CAP_DAC_OVERRIDE reads them as
  empty instead of being refused; /proc's masked files are /dev/null or an empty
  read-only tmpfs;
- /proc: the jail's own pid namespace.  The init is non-dumpable, so its
  /proc/1/root, fd, environ and mem need CAP_SYS_PTRACE (ptrace_may_access), not a
  DAC capability.  /proc/sys and the other writable host knobs are read-only binds,
  and most of /proc's writable files check a capability of their own (SYS_ADMIN,
  SYS_RESOURCE, NET_ADMIN) besides the mode bits;
- /sys: mounted read-only; its files are root's;
- set-id files: CAP_FOWNER and CAP_FSETID let the jail make a set-uid file of any
  owner in its own trees, as uid 0 could already make a set-uid-root one.  Inside the
  jail no_new_privs makes such bits inert; outside, the upper dir lies under the
  state dir's capsules/ (root's, mode 0700), out of other users' reach, a capsule's
  own disk is mounted nosuid,nodev, and promotion refuses set-id bits.

Where the host's trees cannot be idmapped (a kernel before 6.15, which cannot build the
jail's root detached; a system tree on a filesystem without idmapped mounts) a root
caller's jail keeps none of the four, as before issue 25, and its ``isolation`` says why
(``host_trees``).  An exposed toolchain on such a filesystem fails the exec, naming it.

The rootless helper never grants them.  There the caller is not root: the helper's
user namespace maps the caller to 0, so its jail runs as uid 0 of that namespace, but
capabilities there reach only inodes owned by mapped ids (the caller's own), and the
host never let that user past its own mode bits.  A root caller's jail in the initial
namespace is the only case where the host would have passed the check.

What a root caller gives up by this: nothing the host did not already allow it.  What it
still does not get: another user's files outside its capsule, another user's identity (no
SETUID), reading by handle, any mount, device nodes, ptrace, the network's administration.
"""

from __future__ import annotations

from sandbox import namespaces

CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID = 0, 1, 3, 4
FILE_OWNER_CAPS = (CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID)
FILE_OWNER_MASK = sum(1 << cap for cap in FILE_OWNER_CAPS)  # 0x1b
NAMES = {CAP_CHOWN: "CAP_CHOWN", CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE", CAP_FOWNER: "CAP_FOWNER",
         CAP_FSETID: "CAP_FSETID"}


def kept_for(uid: int, uid_ranges: list[tuple[int, int, int]], host_trees_mapped: bool) -> int:
    """The capability mask a jail of ``uid`` keeps: the file-ownership four for root in the initial
    user namespace (the privileged helper's root caller) whose jail shows the host's trees
    idmapped (``host_trees_mapped``: sandbox/idmap.py), else none."""
    if uid == 0 and namespaces.is_initial_user_namespace(uid_ranges) and host_trees_mapped:
        return FILE_OWNER_MASK
    return 0


def mechanism() -> str:
    """What ``hello``'s mechanisms say of the jail's capabilities."""
    names = ", ".join(NAMES[cap] for cap in FILE_OWNER_CAPS)
    return (f"none, except a root caller's jail under the privileged helper whose host trees are idmapped "
            f"(host_trees): {names} (bounding, effective, permitted; inheritable and ambient empty), which pass "
            "mode bits in the capsule's own trees only, as root's do on the host")
