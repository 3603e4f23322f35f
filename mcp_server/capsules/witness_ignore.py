"""What promotion would leave behind, judged at replay time by the rules a witness carries.

Promotion leaves behind what the live workspace's git ignores (fs/gitignore.py): a
coverage report, a build directory, ``node_modules/``.  A replay that compared those
files would fail on bytes no promotion ever carries (nyc rewrites
``coverage/coverage-final.json`` with new timings on every run), so by default a replay
sets their differences apart (replay.py, ``ignored_differences``).  Whether a path is
ignored must be judged by the witness's rules, never by the replayer's tree: the
replayer may have no checkout at all, or one whose ``.gitignore`` says otherwise.  And
the rules are not in the witness's base snapshot: it carries the files the runs used,
which seldom include a ``.gitignore``, and never ``.git/info/exclude`` or the maker's
``core.excludesFile``.  So:

- **At witness time** (``carried_rules``), git is asked in the live workspace, as
  promotion asks it, for the files that hold the rules: every ``.gitignore`` git itself
  does not ignore, in the directories from the work tree's top down to the workspace and
  everywhere inside it (``git ls-files``: one inside an ignored directory can change
  nothing), the repository's ``info/exclude`` and the caller's ``core.excludesFile``.
  Their texts travel in the manifest (``base.ignore``), not as blobs, so a witness made
  without blobs carries them too; with them the workspace's place in its work tree
  (``prefix``: a ``.gitignore`` above it may name paths in it) and the tracked files
  the rules match (``tracked``: git never calls a tracked file ignored, and a scratch
  repository tracks nothing).
- **At replay time** (``judge``), the texts are laid out in a scratch repository (each
  beneath it, never through a link: they come from an archive), its own
  ``core.excludesFile`` pointing at nothing, so that the replayer's global excludes do
  not count, and fs/gitignore.ignored, promotion's own question, is asked there.
- A workspace outside a git work tree ignores nothing when promoted: its witness
  carries no ``ignore``, and neither does one whose rules are past the bounds below or
  whose maker had no git.  Such a witness, and one made before this field, replays
  comparing every file, as before.
- Promotion also leaves behind a directory the capsule made that declares itself a cache
  (fs/gitignore.declares_cache: pytest's ``.pytest_cache/``).  A replay applies that
  rule too (``made_caches``), to the directories the *witness's* capsule made, read from
  the bytes of their markers the witness carries among its changes; only for a witness
  that carries rules, so that one made before them replays as it did.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from mcp_server.fs import gitignore
from mcp_server.fs.fingerprint import run_git
from mcp_server.fs.view import RootView
from sandbox.errors import CcwError

MAX_RULE_FILES = 256
MAX_RULE_BYTES = 256 << 10  # all rule texts together
MAX_TRACKED = 4096
TIMEOUT_S = 30.0
_GIT = ("-c", "core.fsmonitor=false")  # an fsmonitor hook named by the repository would run as the caller


def _git(root: str, *args: str) -> bytes | None:
    """A git command's stdout in ``root``, or None when git is missing, fails or refuses."""
    try:
        proc = run_git(root, *_GIT, *args, check=False, timeout_s=TIMEOUT_S)
    except CcwError:
        return None
    return proc.stdout if proc.returncode == 0 else None


def _names(out: bytes) -> list[str]:
    return [name.decode("utf-8", "surrogateescape") for name in out.split(b"\0") if name]


def _read(path: str, follow: bool = True) -> bytes | None:
    """A rule file's bytes, or None when it is absent or not a regular file (a ``.gitignore`` that
    is a link, unless ``follow``: git does not follow one in the work tree)."""
    try:
        with RootView.open(os.path.dirname(path) or "/") as view:
            return view.read_regular(os.path.basename(path), follow=follow)
    except (CcwError, OSError):
        return None


def _excludes(workspace: str) -> bytes | None:
    """``info/exclude`` and the caller's ``core.excludesFile``, as one text (the latter first: the
    repository's own lines come later and win, as git ranks them)."""
    where = _git(workspace, "rev-parse", "--git-path", "info/exclude")
    if where is None:
        return None
    exclude = os.path.join(workspace, where.decode("utf-8", "surrogateescape").strip())
    named = _git(workspace, "config", "--path", "--get", "core.excludesFile")
    if named is not None:
        user = named.decode("utf-8", "surrogateescape").strip()
    else:
        config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        user = os.path.join(config, "git", "ignore")
    parts = [_read(os.path.join(workspace, user)), _read(exclude)]
    return b"\n".join(part for part in parts if part)


def carried_rules(workspace: str) -> dict[str, Any] | None:
    """The manifest's ``base.ignore``: the rules promotion reads for ``workspace``, or None (module docstring)."""
    top = _git(workspace, "rev-parse", "--show-toplevel")
    prefix_out = _git(workspace, "rev-parse", "--show-prefix")
    if top is None or prefix_out is None:
        return None
    root = top.decode("utf-8", "surrogateescape").rstrip("\n")
    prefix = prefix_out.decode("utf-8", "surrogateescape").rstrip("\n")
    parts = prefix.rstrip("/").split("/") if prefix else []
    above = [posixpath.join(*parts[:depth], ".gitignore") for depth in range(len(parts))]
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                  *above, f":(glob){prefix}**/.gitignore")
    tracked = _git(workspace, "ls-files", "-z", "--cached", "--ignored", "--exclude-standard")
    excludes = _excludes(workspace)
    if listed is None or tracked is None or excludes is None:
        return None
    files, total = [], len(excludes)
    for path in sorted(set(_names(listed))):
        text = _read(os.path.join(root, path), follow=False)
        if text is None:
            continue
        files.append({"path": path, "text": text.decode("utf-8", "surrogateescape")})
        total += len(text)
    tracked_names = _names(tracked)
    if len(files) > MAX_RULE_FILES or total > MAX_RULE_BYTES or len(tracked_names) > MAX_TRACKED:
        return None
    return {"prefix": prefix, "files": files, "exclude": excludes.decode("utf-8", "surrogateescape"),
            "tracked": sorted(tracked_names)}


def made_caches(changes: Sequence[dict[str, Any]], blobs: Mapping[str, bytes]) -> frozenset[str]:
    """The directories among a witness's ``changes`` that its capsule made and that declare
    themselves caches, judged from the markers' bytes in ``blobs`` (as promote.py judges them)."""
    files = {c["path"]: c["blob"] for c in changes if c["type"] == "file" and c["blob"] in blobs}

    def marker(path: str) -> bytes | None:
        data = blobs[files[path]] if path in files else None
        return data if data is not None and len(data) <= gitignore.MAX_MARKER else None

    made = [c["path"] for c in changes if c["status"] == "added" and c["type"] == "dir"]
    return frozenset(d for d in made
                     if gitignore.declares_cache(marker(f"{d}/.gitignore"), marker(f"{d}/CACHEDIR.TAG")))


def within(paths: Collection[str], dirs: Collection[str]) -> frozenset[str]:
    """The ``paths`` that are one of ``dirs`` or below one."""
    below = tuple(d.rstrip("/") + "/" for d in dirs)
    return frozenset(p for p in paths if p in dirs or (below and p.startswith(below)))


def _checked(path: str, what: str) -> str:
    """A path of the witness's rules: relative, no ``..`` and nothing in a ``.git`` (it comes from an archive)."""
    parts = path.rstrip("/").split("/")
    if path.startswith("/") or "\0" in path or any(p in ("..", ".git") for p in parts):
        raise CcwError("INVALID_ARGUMENT", f"the witness's ignore rules name {what} {path!r}, outside its work "
                                           "tree: make the witness again, or replay with strict_outputs: true")
    return path


def judge(rules: dict[str, Any], scratch: str, paths: Sequence[str], dirs: Collection[str]) -> frozenset[str]:
    """Which of ``paths`` (relative to the workspace; ``dirs`` among them directories) the carried
    ``rules`` ignore, asked of git in a repository laid out under the empty directory ``scratch``."""
    if not paths:
        return frozenset()
    if shutil.which("git") is None:
        raise CcwError("UNSUPPORTED", "git is not installed, and the witness's ignore rules need it to say which "
                                      "outputs promotion would leave behind: install git, or replay with "
                                      "strict_outputs: true to compare every file")
    proc = run_git(scratch, "init", "-q", "--template=", check=False, timeout_s=TIMEOUT_S)  # no sample hooks
    if proc.returncode != 0:
        raise CcwError("INTERNAL", f"git init failed in {scratch!r}: {proc.stderr.decode(errors='replace').strip()}; "
                                   "replay with strict_outputs: true to compare every file")
    run_git(scratch, "config", "core.excludesFile", os.devnull, timeout_s=TIMEOUT_S)
    prefix = _checked(rules["prefix"], "the workspace at")
    with RootView.open(scratch) as view:
        for item in rules["files"]:
            path = _checked(item["path"], "the rule file")
            if posixpath.basename(path) != ".gitignore":
                raise CcwError("INVALID_ARGUMENT", f"the witness names {path!r} as a .gitignore: make it again")
            if posixpath.dirname(path):
                view.makedirs(posixpath.dirname(path))
            view.write_bytes(path, item["text"].encode("utf-8", "surrogateescape"))
        view.makedirs(".git/info")
        view.write_bytes(".git/info/exclude", rules["exclude"].encode("utf-8", "surrogateescape"))
        if prefix:
            view.makedirs(prefix.rstrip("/"))
    found = gitignore.ignored(os.path.join(scratch, prefix), list(paths), dirs)
    if isinstance(found, str):  # the repository was just made: git cannot say it is none
        raise CcwError("INTERNAL", f"git calls {scratch!r} {found}; replay with strict_outputs: true")
    return found - frozenset(rules["tracked"])
