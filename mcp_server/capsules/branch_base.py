"""The commit a capsule's base was taken from, recorded when the capsule is made (issue 39).

``capsule_promote {as_branch}`` (capsules/branch.py) parents its commit on this commit,
so it must be the one HEAD named when the capsule was made, not HEAD when the branch is
asked for: the host may have committed since, and the capsule's change was made against
the tree as it stood.

It is kept in the journal's ``base_fingerprint`` column, which forks inherit (a fork's
base is its parent's), as ``{"head_oid": OID}``: the seed's fingerprint would also hash
the index and ``git status``, whose cost grows with the tree, and nothing here needs
them, so only the commit is read: one ``git rev-parse`` (a median of 10 ms on a busy
2-core VM), in a thread while the helper makes the capsule's view, so creation does
not wait for it.

A capsule made before this was recorded, or over a directory that is no git worktree's
top level, or over a repository with no commit yet, has none; a branch of it is refused
and says so.  The workspace's uncommitted edits at creation are part of the capsule's
base, not of this commit: a file the capsule changed lands on the branch whole, as the
capsule has it, so such edits to that file come along; edits to files it left alone do not.

``-c safe.directory=*``: a root server over a checkout another user owns reads its HEAD
as that user's git would; rev-parse runs nothing that the repository's config names.
"""

from __future__ import annotations

import os
import re

from mcp_server.fs.fingerprint import run_git
from sandbox.errors import CcwError

_OID_RE = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
TIMEOUT_S = 30


def base_commit(workspace: str) -> dict[str, str] | None:
    """``{"head_oid": OID}`` when ``workspace`` is a git worktree's top level whose HEAD names a
    commit; None otherwise (no git, no repository, a subdirectory, no commit yet)."""
    try:
        proc = run_git(workspace, "-c", "safe.directory=*", "rev-parse", "--show-toplevel", "HEAD^{commit}",
                       check=False, timeout_s=TIMEOUT_S)
    except CcwError:  # no git on the host, or it hung
        return None
    lines = proc.stdout.decode("utf-8", "surrogateescape").splitlines()
    if proc.returncode != 0 or len(lines) != 2 or not _OID_RE.fullmatch(lines[1]):
        return None
    if os.path.realpath(lines[0]) != os.path.realpath(workspace):
        return None
    return {"head_oid": lines[1]}


def recorded_commit(base_fingerprint: dict[str, object] | None) -> str | None:
    """The commit a journal's ``base_fingerprint`` records (None: not recorded)."""
    oid = (base_fingerprint or {}).get("head_oid")
    return oid if isinstance(oid, str) and _OID_RE.fullmatch(oid) else None
