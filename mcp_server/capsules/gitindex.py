"""Whether an index a promotion would write stages only what the person can see (core/hazards.py).

The index is git's data, and an ordinary capsule changes it: ``git add`` stages a file,
``git commit`` leaves the index equal to the new commit.  But it also says what the next
``git commit`` on the host commits, whatever the work tree holds: a capsule that writes
an index naming a blob of its own choosing for ``src/auth.py`` (``git update-index
--cacheinfo``) has the person commit that blob, while the promoted diff and ``git diff``
show nothing (``git diff --cached`` would).  So every entry of a promoted index must be
explained by something the person can see once the promotion is written: the index's
entry before (the host's ``.git/index`` at the same path and stage), the file at that
path (its bytes', or a link's target's, blob id: what ``git add`` stages where no clean
filter rewrites it; or its bytes with each CRLF made LF, what a line-ending conversion
stages, the same lines), or the entry at that path in the tree of the commit ``HEAD``
names (a commit leaves the index so, and the commit is in the promoted history).  An
entry names a mode as well as a blob, and a mode is content too (the next commit makes
the file executable, or a link): it must be the one its explanation has, where a file's
is its executable bit (or, as git keeps it under ``core.fileMode=false``, the index's
mode before).  "Once written" means the capsule's state at a path the promotion writes
and the workspace's elsewhere: a file the scope leaves behind (git-ignored, excluded)
explains nothing it does not hold in the workspace, or ``git add -f`` of an ignored file
would stage content the person never receives.  An entry explained by none, or an
index git could not read, makes the index ``git_control``; so does a file staged but not
committed in a repository whose attributes filter it (git-lfs): its staged blob is the
filter's output, not the bytes.

The objects read for ``HEAD`` are the capsule's own loose objects whose bytes hash to
their names (``checked_data``, hazards.true_loose_object), inflated here, and otherwise
the workspace's: the workspace's own git lists its trees (hooks and fsmonitor off, no
inherited ``GIT_*``).  The capsule's git directory is never run, as capsules/gitrefs.py
says why.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable

from mcp_server.capsules import gitrefs
from mcp_server.core import gitindex, hazards, refmoves
from mcp_server.core.gitindex import IndexEntry
from mcp_server.fs.changeset import Entry
from mcp_server.fs.fingerprint import NO_HOOKS, git_env, run_git
from mcp_server.fs.view import DirFds, RootView, Side

MAX_INDEX = 256 << 20  # larger than any index git writes for a real tree; past it, unread and a hazard
MAX_TREE = 64 << 20  # a tree object inflated to look a name up in it
MAX_SHOWN = 3  # unexplained paths a reason names
TIMEOUT_S = 60
_HARDENED = ("-c", "safe.directory=*", *NO_HOOKS)
_FILE_MODES = (0o100644, 0o100755, 0o100664)
Held = tuple[int, str]  # an entry's (mode, oid) as git compares them: 100664 is git's old 100644


def reasons(capsule: RootView, workspace: str, entries: Iterable[Entry], bare_gitdirs: Collection[str],
            checked_data: Collection[str]) -> dict[str, str]:
    """Why each index file promoting ``entries`` would write is ``git_control`` (none: every entry explained)."""
    indexes = []
    for entry in entries:
        inside = hazards.in_gitdir(entry.path, bare_gitdirs)
        if inside is not None and inside[1].casefold() == "index" and entry.new is not None \
                and entry.new.kind == "file":
            indexes.append((entry.path, inside[0]))
    if not indexes:
        return {}
    found = {}
    promoted = frozenset(entry.path for entry in entries)
    with RootView.open(workspace) as live_view, DirFds(live_view) as live, DirFds(capsule) as new:
        after = _After(live, new, promoted)
        for path, gitdir in indexes:
            why = _judged(live, after, path, gitdir, gitdir not in bare_gitdirs, checked_data,
                          os.path.join(workspace, gitdir))
            if why is not None:
                found[path] = why
    return found


class _After:
    """The workspace as the promotion leaves it: the capsule's state at a path it writes, the workspace's
    at any other (one the capsule did not change, or the scope left behind)."""

    def __init__(self, live: DirFds, new: DirFds, promoted: frozenset[str]) -> None:
        self.live, self.new, self.promoted = live, new, promoted

    def _at(self, path: str) -> DirFds:
        return self.new if path in self.promoted else self.live

    def read_regular(self, path: str) -> bytes | None:
        return self._at(path).read_regular(path)

    def read_stat(self, path: str) -> tuple[bytes, os.stat_result] | None:
        return self._at(path).read_stat(path)

    def lstat(self, path: str) -> Side | None:
        return self._at(path).lstat(path)


def _held(one: IndexEntry) -> Held:
    return (0o100644 if one.mode == 0o100664 else one.mode), one.oid


def _judged(live: DirFds, after: _After, path: str, gitdir: str, has_worktree: bool,
            checked_data: Collection[str], host_gitdir: str) -> str | None:
    data = after.read_regular(path)
    if data is None or len(data) > MAX_INDEX:
        return "an index git would not read as one (a non-file, or larger than any tree's): unchecked"
    try:
        staged = gitindex.parse_index(data)
    except ValueError as exc:
        return f"an index that is not git's ({exc}): git would refuse the repository, or read it otherwise"
    old_data = live.read_regular(path)
    try:
        before = {(one.path, one.stage): _held(one) for one in gitindex.parse_index(old_data or b"")}
    except ValueError:
        before = {}
    size = len(staged[0].oid) // 2 if staged else 20
    prefix = gitdir.rpartition("/")[0] if has_worktree else None
    left = [one for one in staged if (was := before.get((one.path, one.stage))) != _held(one)
            and (prefix is None or not _in_worktree(after, prefix, one, size, was))]
    if left:
        left = _unheld_by_head(after, gitdir, left, size, checked_data, host_gitdir)
    if not left:
        return None
    shown = ", ".join(one.path for one in left[:MAX_SHOWN]) + (f" and {len(left) - MAX_SHOWN} more"
                                                                  if len(left) > MAX_SHOWN else "")
    return (f"the index stages content for {shown} that is neither the file promoted there, the index's before, "
            "nor the new HEAD's: the next git commit would commit it, though the promoted diff does not show it "
            "(git diff --cached does); stage the file again (git add) or unstage it (git restore --staged) in "
            "the capsule, or allow git_control")


def _in_worktree(view: _After, prefix: str, one: IndexEntry, size: int, before: Held | None) -> bool:
    """Whether ``one`` stages what the file at its path holds once promoted (a link: its target), in the
    mode the file has (or had in the index ``before``)."""
    path = f"{prefix}/{one.path}" if prefix else one.path
    if one.mode in _FILE_MODES:
        read = view.read_stat(path)
        if read is None:
            return False
        data, info = read
        mode = 0o100755 if info.st_mode & 0o100 else 0o100644
        if _held(one)[0] != mode and (before is None or before[0] != _held(one)[0]):
            return False
        return gitindex.object_id("blob", data, size) == one.oid or (
            b"\r\n" in data and gitindex.object_id("blob", data.replace(b"\r\n", b"\n"), size) == one.oid)
    if one.mode == 0o120000:
        side = view.lstat(path)
        target = None if side is None or side.kind != "symlink" else side.target
        return target is not None and gitindex.object_id("blob", os.fsencode(target), size) == one.oid
    return False


def _unheld_by_head(view: _After, gitdir: str, left: list[IndexEntry], size: int,
                    checked_data: Collection[str], host_gitdir: str) -> list[IndexEntry]:
    """The entries of ``left`` that the tree of the commit HEAD names does not hold, mode and blob."""
    commit = gitrefs.head_commit(view, f"{gitdir}/" if gitdir else "")
    if commit is None:
        return left
    prefix = f"{gitdir}/" if gitdir else ""

    def loose(oid: str, kind: str, most: int) -> bytes | None:
        path = f"{prefix}objects/{oid[:2]}/{oid[2:]}"
        data = view.read_regular(path) if path in checked_data else None
        return None if data is None else gitindex.loose_body(data, kind, most)

    body = loose(commit, "commit", MAX_TREE)
    # Each entry's (mode, oid) in HEAD's tree, walked through the capsule's loose trees; where one is the
    # workspace's, the rest of the path is asked of the workspace's git, once per such tree.
    asks: dict[str, list[str]] = {}
    looked: list[tuple[IndexEntry, Held | None, tuple[str, str] | None]] = []  # entry, found, or (tree, rest) asked
    for one in left:
        at, parts = (commit if body is None else gitindex.commit_tree(body)), one.path.split("/")
        found = None
        for depth in range(len(parts)):
            tree_body = None if body is None else loose(at, "tree", MAX_TREE) if at else None
            if at is not None and tree_body is None:
                rest = "/".join(parts[depth:])
                asks.setdefault(at, []).append(rest)
                looked.append((one, None, (at, rest)))
                break
            found = None if tree_body is None else gitindex.tree_entry(tree_body, os.fsencode(parts[depth]), size)
            at = None if found is None else found[1]
            if at is None:
                looked.append((one, None, None))
                break
        else:
            looked.append((one, found, None))
    answers = {treeish: _host_ls_tree(host_gitdir, treeish, paths) for treeish, paths in asks.items()}
    return [one for one, found, asked in looked
            if (answers[asked[0]].get(asked[1]) if asked is not None else found) != _held(one)]


def _host_ls_tree(gitdir: str, treeish: str, paths: list[str]) -> dict[str, Held]:
    """What the workspace's git says ``treeish`` holds at ``paths`` (path -> mode, oid); empty if it cannot say."""
    if not refmoves.is_oid(treeish):
        return {}
    proc = run_git(gitdir, *_HARDENED, "ls-tree", "-z", "--full-tree", treeish, "--", *paths,
                   env=git_env({"GIT_DIR": gitdir}), check=False, timeout_s=TIMEOUT_S)
    if proc.returncode != 0:
        return {}
    out = {}
    for record in proc.stdout.split(b"\0"):
        info, tab, name = record.partition(b"\t")
        fields = info.split()
        if tab and len(fields) == 3 and fields[0].isdigit():
            out[os.fsdecode(name)] = int(fields[0], 8), fields[2].decode("ascii", "replace")
    return out
