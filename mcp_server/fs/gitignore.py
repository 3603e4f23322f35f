"""Promotion scope: which changed paths the live workspace's git ignores, and path globs.

Which rules decide "ignored", and why the live workspace's:

- git is asked in the **live workspace** (``git -C WORKSPACE check-ignore``), never in
  the capsule.  A capsule can write its own ``.gitignore``: one that ignores ``.envrc``
  would hide a file from review by having it skipped (harmless: skipped means not
  written), but one that *un-ignores* build output, or ignores ``src/`` so an edit there
  looks like litter, would let the capsule choose what counts.  The rules that decide
  are those the user's checkout holds on the host (``.gitignore`` files, ``.git/info/
  exclude``) plus the caller's global excludes (``core.excludesFile``): the front end runs
  as the caller, so git reads the caller's config, as it does in the user's own shell.
  A ``.gitignore`` the capsule changed is itself an ordinary changed path.
- Without ``--no-index``: a **tracked** file is never reported as ignored, even when a
  pattern matches it (git tracks it, so a change to it is a change the user wants
  promoted).  Parent directories count: with ``build/`` ignored, ``build/x.o`` is.
- Hardened: no inherited ``GIT_*`` (fs/fingerprint.git_env), ``-c core.fsmonitor=false``
  (an fsmonitor hook named by the repository's config would otherwise run as the
  caller), no optional locks, one call for all paths through ``--stdin -z``, and a
  timeout.  check-ignore runs no hooks.
- A workspace that is not inside a git work tree ignores nothing (``NOT_A_REPOSITORY``).
- One exception to "never the capsule's rules", in the safe direction only: a directory
  the capsule *made* that declares itself a cache, with a ``.gitignore`` of just ``*``
  (pytest's ``.pytest_cache/``, mypy's and ruff's caches) or a ``CACHEDIR.TAG`` with the
  Cache Directory Tagging signature, is ignored as a whole (``self_ignored``).  It can
  only leave more behind, never un-ignore anything, and it never covers a path the live
  tree has (a made directory holds no tracked file).  Without it a developer's first
  ``pytest`` in a capsule promoted ``.pytest_cache/`` into the checkout, where git
  would have ignored it by that very file.

Globs (``paths`` and ``exclude``) match a path relative to the workspace, ``/``
separated: ``*`` ``?`` ``[...]`` match within one component, ``**`` as a whole component
matches any number of components (zero included), and a pattern that matches a
directory also matches everything under it (``build`` selects ``build/x.o``).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from mcp_server.fs.fingerprint import git_env
from sandbox.errors import CcwError

NOT_A_REPOSITORY = "not a git repository"
TIMEOUT_S = 30.0
CACHEDIR_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"  # bford.info/cachedir
# How a caller goes without git's answer: the check is asked by promotion, the diff and a merge.
SKIP = ("skip the check: include_ignored for capsule_promote, ignored for capsule_diff (capsule_merge has no "
        "such switch: promote each attempt by itself)")
MAX_MARKER = 4096  # bytes of a cache dir's .gitignore or CACHEDIR.TAG worth reading


def declares_cache(gitignore: bytes | None, cachedir_tag: bytes | None) -> bool:
    """Whether a made directory says it is a cache: a ``.gitignore`` whose only rule is
    ``*`` (comments and blank lines aside), or a ``CACHEDIR.TAG`` with the signature."""
    if cachedir_tag is not None and cachedir_tag.startswith(CACHEDIR_SIGNATURE):
        return True
    if gitignore is None:
        return False
    rules = [line.strip() for line in gitignore.decode("utf-8", "replace").splitlines()]
    return [rule for rule in rules if rule and not rule.startswith("#")] == ["*"]


def ignored(workspace: str, paths: Sequence[str], dirs: Collection[str] = ()) -> frozenset[str] | str:
    """The paths (relative to ``workspace``) its git ignores, or NOT_A_REPOSITORY.

    ``dirs`` are the paths that are directories in the capsule: they are asked as
    ``path/`` so that a ``build/`` pattern matches a directory the workspace lacks.
    """
    if not paths:
        return frozenset()
    argv = ["git", "-C", workspace, "--no-optional-locks", "-c", "core.fsmonitor=false",
            "check-ignore", "--stdin", "-z"]
    asked = {(p + "/" if p in dirs else p): p for p in paths}
    stdin = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in asked)
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, env=git_env(), timeout=TIMEOUT_S, check=False)
    except FileNotFoundError as exc:
        raise CcwError("UNSUPPORTED", "git is not installed; install git, or promote with include_ignored") from exc
    except subprocess.TimeoutExpired as exc:
        raise CcwError("INTERNAL", f"git check-ignore took over {TIMEOUT_S:.0f} s in {workspace!r}; "
                       + SKIP) from exc
    if proc.returncode == 128 and b"not a git repository" in proc.stderr:
        return NOT_A_REPOSITORY
    if proc.returncode not in (0, 1):  # 1: none of the paths is ignored
        # git refusing a checkout another uid owns (root promoting a user's: "dubious ownership")
        # is the caller's git config's word, not ccw's fault; its message names the fix (safe.directory).
        refused = b"detected dubious ownership" in proc.stderr
        raise CcwError("PERMISSION_DENIED" if refused else "INTERNAL", f"git check-ignore failed in {workspace!r}: "
                       f"{proc.stderr.decode(errors='replace').strip()}; "
                       + ("trust the repository as git says, or " if refused else "") + SKIP,
                       {"returncode": proc.returncode})
    return frozenset(asked[p.decode("utf-8", "surrogateescape")] for p in proc.stdout.split(b"\0") if p)


def _component(part: str) -> str:
    """One path component's glob as a regex: nothing in it matches "/"."""
    out, i = [], 0
    while i < len(part):
        c = part[i]
        end = part.find("]", i + 2) if c == "[" else -1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif end > 0:
            body = part[i + 1:end]
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            out.append(("[^/" if negate else "[") + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def compile_glob(pattern: str) -> re.Pattern[str]:
    """The regex a glob (module docstring) stands for; it matches a path or any path under it."""
    parts = [p for p in pattern.strip("/").split("/") if p]
    if not parts:
        raise CcwError("INVALID_ARGUMENT",
                       f"empty glob {pattern!r}; name a path relative to the workspace, e.g. src/**")
    pieces = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            pieces.append(".*" if last else "(?:[^/]+/)*")
        else:
            pieces.append(_component(part) + ("" if last else "/"))
    return re.compile(f"(?s:{''.join(pieces)})(?:/.*)?\\Z")


@dataclass(frozen=True)
class Scope:
    """What a promotion writes: everything, minus ignored paths, outside ``paths``, or in ``exclude``."""

    include_ignored: bool = False
    paths: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    _paths: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _exclude: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_paths", tuple(compile_glob(p) for p in self.paths))
        object.__setattr__(self, "_exclude", tuple(compile_glob(p) for p in self.exclude))

    def reason(self, path: str, ignored_paths: frozenset[str]) -> str | None:
        """Why ``path`` is skipped ("not in paths", "excluded", "ignored"), or None if it is promoted."""
        if self._paths and not any(p.match(path) for p in self._paths):
            return "not in paths"
        if any(p.match(path) for p in self._exclude):
            return "excluded"
        if not self.include_ignored and path in ignored_paths:
            return "ignored"
        return None

    def split(self, workspace: str, paths: Iterable[str], dirs: Collection[str] = (),
              caches: Collection[str] = ()) -> tuple[list[str], list[dict[str, str]], str | None]:
        """The paths to promote, the skipped ones (path, reason), and why nothing was ignored, if so.

        ``caches``: directories the capsule made that declare themselves caches
        (``declares_cache``); they and everything in them count as ignored.
        """
        paths = list(paths)
        found = ignored(workspace, [] if self.include_ignored else paths, dirs)
        note = found if isinstance(found, str) else None
        ignored_paths = found if isinstance(found, frozenset) else frozenset()
        if caches:
            marked = tuple(cache.rstrip("/") + "/" for cache in caches)
            ignored_paths |= {p for p in paths if p in caches or p.startswith(marked)}
        kept: list[str] = []
        skipped: list[dict[str, str]] = []
        for path in paths:
            why = self.reason(path, ignored_paths)
            if why is None:
                kept.append(path)
            else:
                skipped.append({"path": path, "reason": why})
        return kept, skipped, note
