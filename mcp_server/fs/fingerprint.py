"""The worktree fingerprint (seed 000 §2.2), computed without writing into the repository.

The value and its canonical form are ``mcp_server.core.fingerprint``; this module runs git.

Some facts about asking git questions read-only:

- ``git write-tree`` writes tree objects into the object database and may rewrite the
  index to store its cache-tree.  So it runs with ``GIT_INDEX_FILE`` pointing at a
  temporary *copy* of the index and ``GIT_OBJECT_DIRECTORY`` at a temporary directory,
  with the real object directory as an alternate (``GIT_ALTERNATE_OBJECT_DIRECTORIES``)
  so that the blobs it checks for are found.  Both temporaries are removed afterwards.
- ``git status`` refreshes stat information in the index and writes it back when it can
  take the lock; ``--no-optional-locks`` (``GIT_OPTIONAL_LOCKS=0``) turns that off.
- An unborn branch has no HEAD commit: ``head_oid`` is ``""``.  An index with unmerged
  entries has no tree: ``write-tree`` fails and ``index_oid`` is ``""``.
- ``status_hash`` is the sha256 of ``git status --porcelain=v1 -z``'s raw bytes, which
  include untracked files (as the user's ``status.showUntrackedFiles`` says).
- GIT_* variables of the server's own environment (GIT_DIR, GIT_WORK_TREE, …) would
  point git elsewhere; they are removed before every call.

- What the formula cannot see: porcelain status names files, not contents, so a further
  edit to a file that is already modified (or untracked) leaves the fingerprint as it
  was.  A lease therefore goes stale when a file changes *state* (clean → modified,
  new untracked file, staging, commit), which is seed 000's definition, kept exactly so
  that fingerprints can be recomputed from git's own output.

The workspace must be a git worktree's top level; anything else is INVALID_ARGUMENT.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from mcp_server.core.fingerprint import Fingerprint
from mcp_server.core.paths import sort_paths
from sandbox.errors import CcwError

# Flags for a git run over a repository whose config ccw does not trust to name programs:
# no hooks, no fsmonitor (each would run as the caller).
NO_HOOKS = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment git runs with: no inherited GIT_*, no optional locks, no prompts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_OPTIONAL_LOCKS"] = "0"
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"
    if extra:
        env.update(extra)
    return env


def run_git(root: str, *args: str, env: dict[str, str] | None = None, check: bool = True,
            timeout_s: float | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``git -C root --no-optional-locks ARGS`` and capture its output (INTERNAL past ``timeout_s``)."""
    try:
        proc = subprocess.run(
            ["git", "-C", root, "--no-optional-locks", *args],
            capture_output=True,
            env=env or git_env(),
            check=False,
            timeout=timeout_s,
        )
    except FileNotFoundError as exc:
        raise CcwError("UNSUPPORTED", "git is not installed; install git to use worktree mode") from exc
    except subprocess.TimeoutExpired as exc:
        raise CcwError("INTERNAL", f"git {args[0] if args else ''} took over {timeout_s:.0f} s in {root!r}") from exc
    if check and proc.returncode != 0:
        raise CcwError(
            "INTERNAL",
            f"git {' '.join(args[:3])} failed in {root!r}: {proc.stderr.decode(errors='replace').strip()}",
            {"returncode": proc.returncode},
        )
    return proc


@dataclass(frozen=True)
class RepoPaths:
    """Where a worktree's git data lives."""

    toplevel: str
    git_dir: str
    objects_dir: str
    index_file: str


def repo_paths(root: str) -> RepoPaths:
    """Locate the repository of the worktree at ``root`` (which must be its top level)."""
    proc = run_git(
        root, "rev-parse", "--show-toplevel", "--absolute-git-dir", "--git-path", "objects",
        "--git-path", "index", check=False,
    )
    if proc.returncode != 0:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"workspace {root!r} is not a git worktree; worktree mode needs git (run `git init` there)",
            {"workspace": root},
        )
    top, git_dir, objects, index = proc.stdout.decode("utf-8", "surrogateescape").splitlines()[:4]
    if os.path.realpath(top) != os.path.realpath(root):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"workspace {root!r} is inside the worktree {top!r}; point the workspace at the top level",
            {"workspace": root, "toplevel": top},
        )
    return RepoPaths(
        top,
        git_dir,
        objects if os.path.isabs(objects) else os.path.join(root, objects),
        index if os.path.isabs(index) else os.path.join(root, index),
    )


def compute(root: str, tmp_dir: str | None = None) -> Fingerprint:
    """The live fingerprint of the worktree at ``root``; writes nothing into it."""
    repo = repo_paths(root)
    head = subprocess.Popen(
        ["git", "-C", root, "--no-optional-locks", "rev-parse", "-q", "--verify", "HEAD^{commit}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=git_env(),
    )
    scratch = tempfile.mkdtemp(prefix="ccw-fp-", dir=tmp_dir)
    try:
        index_copy = os.path.join(scratch, "index")
        if os.path.exists(repo.index_file):
            shutil.copyfile(repo.index_file, index_copy)
        objects = os.path.join(scratch, "objects")
        os.mkdir(objects)
        env = git_env(
            {
                "GIT_INDEX_FILE": index_copy,
                "GIT_OBJECT_DIRECTORY": objects,
                "GIT_ALTERNATE_OBJECT_DIRECTORIES": repo.objects_dir,
            }
        )
        # HEAD, status and write-tree are independent: run them side by side.
        status = subprocess.Popen(
            ["git", "-C", root, "--no-optional-locks", "status", "--porcelain=v1", "-z"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=git_env(),
        )
        tree = run_git(root, "write-tree", env=env, check=False)
        out, err = status.communicate()
        head_out, _ = head.communicate()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if head.returncode is None:  # an error above left it running: reap it
            head.kill()
            head.wait()
    head_oid = head_out.decode().strip() if head.returncode == 0 else ""
    if status.returncode != 0:
        raise CcwError("INTERNAL", f"git status failed in {root!r}: {err.decode(errors='replace').strip()}")
    index_oid = tree.stdout.decode().strip() if tree.returncode == 0 else ""
    return Fingerprint(head_oid, index_oid, hashlib.sha256(out).hexdigest())


def candidate_files(root: str, pathspecs: list[str] | None = None) -> list[str]:
    """Tracked and untracked-but-not-ignored files (git's ignore rules), in byte order."""
    args = ["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--deduplicate", "--"]
    proc = run_git(root, *args, *(pathspecs or []))
    names = {os.fsdecode(raw) for raw in proc.stdout.split(b"\0") if raw}
    return sorted(names, key=lambda p: p.encode("utf-8", "surrogateescape"))


_STATUS = {"A": "added", "D": "deleted", "M": "modified", "T": "type_changed", "R": "modified", "C": "added"}
_UNMERGED = {"DD", "AU", "UD", "UA", "DU", "AA", "UU"}


def parse_porcelain(raw: bytes) -> list[dict[str, str]]:
    """``git status --porcelain=v1 -z --no-renames`` → sorted ``[{path, status}]``."""
    out = {}
    for record in raw.split(b"\0"):
        if len(record) < 4:
            continue
        xy, path = record[:2].decode(), os.fsdecode(record[3:])
        if xy in _UNMERGED:
            status = "conflicted"
        elif xy == "??":
            status = "untracked"
        elif "D" in xy:
            status = "deleted"
        elif xy[0] == "A":
            status = "added"
        elif "T" in xy:
            status = "type_changed"
        else:
            status = _STATUS.get(xy[1] if xy[1] != " " else xy[0], "modified")
        out[path] = status
    return [{"path": p, "status": out[p]} for p in sort_paths(out)]
