"""Promoting the branches and tags a capsule's git moved in a git dir outside its workspace (issue 25).

A worktree capsule's commit lands in its copy of the repository's ``.git``
(sandbox/gitdirs.py).  Promotion carries it to the host the way git carries commits
between repositories, never by copying the capsule's git dir:

1. In a scratch fork of the capsule, git lists the moved refs' new commits and writes a
   bundle of what the host lacks (``git bundle create … ^<host's commits>``).  The fork's
   git runs the capsule's own config and hooks, in the jail.
2. On the host, as the caller, ``git fetch`` reads the bundle into the repository with
   ``transfer.fsckObjects`` (index-pack checks every object, as for a push from a
   stranger): the bundle and the commit ids are the capsule's, hence hostile; hooks off
   (``core.hooksPath=/dev/null``), no fsmonitor, no inherited ``GIT_*``.  The objects are
   inert until a ref names them.
3. Each moved ref must be a fast-forward of the host's (or new); anything else is refused
   (REPO_CHANGED) before the workspace is written.
4. After the workspace's files, ``git update-ref NEW OLD`` moves each ref only if it still
   holds what was checked (compare-and-swap); if the worktree has the branch checked out,
   its index takes the promoted paths from the new commit (``git reset -- paths``), so
   ``git status`` on the host is as clean as in the capsule.

Only ``refs/heads/*`` and ``refs/tags/*``, added or changed, promote; a deleted ref, a
moved ``HEAD``, ``packed-refs`` or another namespace (``refs/stash``) is refused
(capsules/gitdirs.py), and the rest of the git dir (the capsule's index, logs,
config, hooks) is left behind and listed.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import trio

from mcp_server.capsules import gitowner
from mcp_server.capsules.exec import exec_request
from mcp_server.fs.fingerprint import NO_HOOKS, git_env
from mcp_server.fs.view import RootView
from sandbox.errors import CcwError

_OID_RE = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
BUNDLE = ".ccw-promote.bundle"  # in the scratch fork's workspace, read through its root
MAX_BUNDLE = 256 << 20  # read into memory; a larger change is carried by hand
TIMEOUT_S = 300
_HARDENED = (*NO_HOOKS, "-c", "transfer.fsckObjects=true")
# The fork's git, in the jail: it runs the capsule's config anyway, so a checkout another uid owns (a root
# caller's, trusted on the host by safe.directory in a config the jail does not see) is no reason to refuse.
_FORK_GIT = ("git", "-c", "safe.directory=*")


@dataclass(frozen=True)
class RefMove:
    """A ref the capsule moved: the host's value when checked (None: new there) and the capsule's."""

    ref: str
    old: str | None
    new: str


def _git(workspace: str, *args: str, stdin: bytes | None = None, check: bool = True,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """git ARGS in ``workspace``, hooks and fsmonitor off, with no inherited GIT_* but ``env``'s."""
    argv = ["git", "-C", workspace, *_HARDENED, *args]
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, env=git_env(env), timeout=TIMEOUT_S, check=False)
    except FileNotFoundError as exc:
        raise CcwError("UNSUPPORTED",
                       "git is not installed on the host: a capsule's commits cannot be promoted") from exc
    if check and proc.returncode != 0:
        raise CcwError("INTERNAL",
                       f"git {args[0]} failed in {workspace!r}: {proc.stderr.decode(errors='replace').strip()}",
                       {"returncode": proc.returncode})
    return proc


def _host_commit(workspace: str, ref: str) -> str | None:
    proc = _git(workspace, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}", check=False)
    oid = proc.stdout.decode().strip()
    return oid if proc.returncode == 0 and oid else None


def _host_state(workspace: str, refs: list[str]) -> tuple[dict[str, str | None], str | None]:
    """Each ref's commit on the host (None: absent) and HEAD's, once every name is a valid ref name
    (names are the capsule's: ``a:refs/heads/main`` would be a fetch refspec)."""
    bad = [ref for ref in refs if _git(workspace, "check-ref-format", ref, check=False).returncode != 0]
    if bad:
        raise CcwError("UNSUPPORTED", f"the capsule's git made refs with names git refuses ({', '.join(bad[:5])}); "
                       "nothing was written. Rename them in the capsule", {"refs": bad})
    # A branch checked out elsewhere would move under that checkout (git's denyCurrentBranch case).
    elsewhere = _checked_out_elsewhere(workspace, refs)
    if elsewhere:
        raise CcwError("UNSUPPORTED", f"the capsule's git moved {', '.join(sorted(elsewhere))}, checked out in another "
                       f"worktree ({', '.join(sorted(set(elsewhere.values())))}); nothing was written. "
                       "Move it back in the capsule and merge on the host", {"refs": sorted(elsewhere)})
    return {ref: _host_commit(workspace, ref) for ref in refs}, _host_commit(workspace, "HEAD")


def _checked_out_elsewhere(workspace: str, refs: list[str]) -> dict[str, str]:
    """The refs among ``refs`` that a worktree other than ``workspace`` has checked out, with its path."""
    listed = _git(workspace, "worktree", "list", "--porcelain", "-z").stdout.decode("utf-8", "surrogateescape")
    out, path = {}, ""
    for field in listed.split("\0"):
        if field.startswith("worktree "):
            path = field[len("worktree "):]
        elif field.startswith("branch ") and field[len("branch "):] in refs and os.path.realpath(path) != workspace:
            out[field[len("branch "):]] = path
    return out


async def _capsule_commits(service: Any, fork_id: str, spec: Any, refs: list[str]) -> dict[str, str]:
    listed = (await service.scratch_exec(exec_request(
        fork_id, [*_FORK_GIT, "for-each-ref", "--format=%(objectname) %(refname)", *refs]), spec)).value
    news: dict[str, str] = {}
    for line in listed.stdout.decode("utf-8", "replace").splitlines():
        oid, _, ref = line.partition(" ")
        if ref in refs and _OID_RE.fullmatch(oid):
            news[ref] = oid
    if listed.exit_code != 0 or sorted(news) != sorted(refs):
        raise CcwError("INTERNAL", f"git in the capsule did not list the refs it moved ({', '.join(refs)}): "
                       f"{listed.stderr.decode('utf-8', 'replace').strip()[-500:]}")
    return news


async def _bundle(service: Any, fork_id: str, spec: Any, refs: list[str], exclude: list[str]) -> bytes:
    made = (await service.scratch_exec(exec_request(
        fork_id, [*_FORK_GIT, "bundle", "create", "-q", BUNDLE, *refs, *(f"^{oid}" for oid in exclude)]), spec)).value
    if made.exit_code != 0:
        raise CcwError("INTERNAL", f"git bundle failed in the capsule: {made.stderr.decode('utf-8', 'replace')[-500:]}")
    root_fd = await service.open_root(fork_id)
    return await trio.to_thread.run_sync(_read_bundle, root_fd)


def _read_bundle(root_fd: int) -> bytes:
    """The bundle the fork's git wrote at its workspace's top (no command runs there any more)."""
    with RootView.from_fd(root_fd) as view:
        st = os.stat(BUNDLE, dir_fd=view.fd, follow_symlinks=False)
        data = view.read_regular(BUNDLE) if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_BUNDLE else None
    if data is None:
        raise CcwError("UNSUPPORTED", f"the capsule's commits make no bundle file of at most {MAX_BUNDLE >> 20} MiB; "
                       "carry them by hand (git bundle in the capsule)")
    return data


async def prepare(service: Any, capsule_id: str, workspace: str, refs: list[str],
                  dry_run: bool = False) -> list[RefMove]:
    """The capsule's commits fetched into the host repository and each move checked to be a fast-forward
    (REPO_CHANGED otherwise); nothing but unreferenced objects is written.  ``dry_run``: the same
    refusals, nothing written at all (the fork's git checks each move against the host's commit)."""
    olds, head = await trio.to_thread.run_sync(_host_state, workspace, refs)
    spec = service.live_record(capsule_id).spec
    async with service.scratch_fork(capsule_id) as fork_id:
        news = await _capsule_commits(service, fork_id, spec, refs)
        moves = [RefMove(ref, olds[ref], news[ref]) for ref in refs if olds[ref] != news[ref]]
        if not moves:
            return []
        if dry_run:
            _refuse_behind([move.ref for move in moves if not await _follows(service, fork_id, spec, move)])
            return moves
        exclude = sorted({oid for oid in (*olds.values(), head) if oid})
        bundle = await _bundle(service, fork_id, spec, [move.ref for move in moves], exclude)
    await trio.to_thread.run_sync(_fetch, workspace, bundle, moves)
    return moves


def _fetch(workspace: str, bundle: bytes, moves: list[RefMove]) -> None:
    was = gitowner.before(workspace)
    try:
        with tempfile.NamedTemporaryFile(prefix="ccw-promote-", suffix=".bundle") as file:
            file.write(bundle)
            file.flush()
            _git(workspace, "fetch", "-q", "--no-tags", "--no-write-fetch-head", file.name, *(m.ref for m in moves))
    finally:
        gitowner.give_back(was)
    # The ids are the capsule's: each must now name a commit here (or a tag of one), not a blob.
    odd = [m.ref for m in moves if _host_commit(workspace, m.new) is None]
    if odd:
        raise CcwError("UNSUPPORTED", f"the capsule's {', '.join(odd)} name no commit; nothing was written",
                       {"refs": odd})
    _refuse_behind([m.ref for m in moves if m.old is not None and _git(
        workspace, "merge-base", "--is-ancestor", m.old, m.new, check=False).returncode != 0])


async def _follows(service: Any, fork_id: str, spec: Any, move: RefMove) -> bool:
    """Whether the capsule's commit descends from the host's (a host commit made after the
    capsule, which its git never saw, is no ancestor: git exits 128 on it)."""
    if move.old is None:
        return True
    asked = (await service.scratch_exec(exec_request(
        fork_id, [*_FORK_GIT, "merge-base", "--is-ancestor", move.old, move.new]), spec)).value
    return asked.exit_code == 0


def _refuse_behind(behind: list[str]) -> None:
    if behind:
        raise CcwError("REPO_CHANGED", f"the host moved {', '.join(behind)} since the capsule was made: its commits "
                       "no longer follow; nothing was written. Re-create the capsule from the current branch and "
                       "redo the change, or merge by hand", {"refs": behind})


def apply(workspace: str, moves: list[RefMove], applied: list[str], capsule_id: str) -> list[dict[str, Any]]:
    """Move each ref (compare-and-swap on the value checked); a checked-out branch's index takes the
    promoted paths from its new commit.  The refs moved, as the promotion result lists them."""
    zero = "0" * 40
    was = gitowner.before(workspace)
    try:
        for move in moves:
            _git(workspace, "update-ref", "-m", f"ccw: promoted from capsule {capsule_id}", move.ref, move.new,
                 move.old or zero)
    finally:
        gitowner.give_back(was, [path for move in moves for path in (move.ref, f"logs/{move.ref}")])
    head = _git(workspace, "symbolic-ref", "-q", "HEAD", check=False).stdout.decode().strip()
    if applied and any(move.ref == head for move in moves):
        paths = b"".join(os.fsencode(path) + b"\0" for path in applied)
        _git(workspace, "reset", "-q", "--pathspec-from-file=-", "--pathspec-file-nul", stdin=paths)
    return [{"ref": move.ref, "old": move.old, "new": move.new} for move in moves]
