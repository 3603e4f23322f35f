"""Hazards: what a promotion would carry into the host tree that runs or escalates there.

A capsule is hostile (ARCHITECTURE.md, "Decisions": every exit is a boundary): whatever it wrote, the
jail held it.  Promotion moves it out of the jail, so what the capsule's files would *do*
on the host is judged here, under every policy (``baseline`` included), before anything
is written.  Pure logic: the caller passes the change set the Promoter will write, the
directories that look like bare repositories and the paths the host's git config names;
``find`` names each hazard.

Some facts this module is built on:

- Promotion writes as the caller (often root) and keeps the capsule's mode bits.  A file
  with the setuid or setgid bit that root writes is a setuid-root program on the host,
  where the jail's no_new_privs no longer holds.  ``cp /bin/sh s; chmod 6755 s`` in a
  capsule run by root is exactly that.
- Git runs programs that its repository names: hooks (``hooks/*``) and config
  (``core.hooksPath``, ``core.fsmonitor``, ``core.pager``, ``core.sshCommand``, filter,
  diff and merge drivers, ``include.path``).  Git finds a repository at a ``.git``
  directory, at a ``.git`` *file* (``gitdir: elsewhere``), and at any directory that
  looks like a bare repository (``HEAD``, ``objects/``, ``refs/``) when run inside it,
  as shell prompts do on every ``cd``; ``objects/`` and ``refs/`` may be in the directory
  a ``commondir`` file names instead, whose config and hooks git then uses
  (``looks_like_gitdir``).  So anything a capsule writes there is code the
  next ``git status`` or ``git commit`` on the host runs, outside any jail.  Git's
  *data* (objects, refs, logs, the index, ``HEAD``) names no program: a commit made in
  a capsule still promotes.  That list is an allowlist (``GIT_DATA``), so whatever git
  adds next is refused until it is argued into it.
- The host's git config can also name files *of the tree*: ``include.path =
  ../tools/gitconfig``, ``core.hooksPath = .githooks``, ``filter.x.clean =
  ./scripts/clean.sh``.  Such a file is config git reads or code git runs, on the host,
  though its name says nothing of it; which files those are depends on the host's config
  as it stands before promotion, so the caller reads it (fs/gitconfig.py) and passes
  them in as ``ConfigNamed``.  A change to one, to anything in a hooks directory so
  named, or a link on the way to one, is ``git_control``.
- Tools run files of the tree by themselves: direnv on ``cd``, VS Code on folder open,
  pre-commit and husky on commit, dev containers on open (``initializeCommand`` runs
  on the host).  ``AUTORUN`` names them, each with its reason.  The project's own code
  (a Makefile, ``package.json`` scripts, ``conftest.py``, ``.venv/``) is not there: it
  runs when the user asks for it, and the diff shows it as the code it is.
- A symlink standing in for a directory such a tool reads (``.vscode -> decoy``) plants
  as much as a file inside it, so a link on the way to a listed file counts.
- On a case-insensitive filesystem (ext4 casefold, vfat) ``.Git`` is ``.git``: names are
  compared casefolded.  (NTFS's and HFS+'s further aliases, ``GIT~1`` or ignorable code
  points, do not arise on the Linux filesystems a workspace lives on.)

The kinds, as capsule_promote's ``allow_hazards`` names them:

- ``setuid``: a setuid or setgid bit on a file.  Not on a directory: a setgid directory
  only passes its group on (``git init --shared`` makes them).  Allowed, the file is
  promoted *without* the bits: fs/promote.py never writes them, since no agent's change
  needs a setuid program and a project that ships one installs it by hand as root.
- ``world_writable``: a file, or a directory without the sticky bit, that becomes
  writable by every user, who could then change what its owner runs.  One that was
  already so in the workspace is nothing new.  Allowed: kept as the capsule has it.
- ``git_control``: a ``.git`` entry itself, or anything in a git directory (``.git`` at
  any depth, nested repositories and submodules included, or a bare-looking directory)
  outside ``GIT_DATA``, and a link anywhere in one (git follows it, for data too); and a
  path the host's git config names (``ConfigNamed``); a ref moved, deleted or planted (core/refmoves.py);
  an index staging what no file, old index or new HEAD holds (capsules/gitindex.py).  Allowed: promoted.
- ``autorun``: a path ``AUTORUN`` lists.  Allowed: promoted as the capsule has it.

Deletions count for ``git_control`` and ``autorun`` too: removing a hook or a
``.pre-commit-config.yaml`` disarms a check the user relies on, and ``rm -rf .git`` in a
capsule would take the repository's history with it.

Left out on purpose: ``.gitattributes`` (it can only select filter, diff and merge
drivers that a git config defines, and that config is ``git_control``); ``.env.*``
variants such as ``.env.local`` (frameworks read them into their own process after it
started, where loader variables like ``LD_PRELOAD`` no longer act); ``.lfsconfig``
(git-lfs honours only URLs and fetch lists from it, no command); CI files such as
``.github/workflows`` (they run on the CI's machines, not this host; ``strict`` denies
them as paths).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SETID_BITS = 0o6000  # S_ISUID | S_ISGID
_WORLD_WRITE = 0o002
_STICKY = 0o1000

# Each kind: what it is, and what allowing it does.
KINDS: dict[str, tuple[str, str]] = {
    "setuid": ("a setuid or setgid bit on a file", "promoted without the bits, which are never written"),
    "world_writable": ("a file or directory made writable by every user", "promoted with that mode"),
    "git_control": ("git hooks, config and repository pointers, and the files the host's git config names",
                    "promoted as the capsule has them"),
    "autorun": ("a file a tool runs or obeys by itself (AUTORUN)", "promoted as the capsule has it"),
}


@dataclass(frozen=True)
class Change:
    """One path the Promoter would change, as the hazard rules need it."""

    path: str  # repo-relative
    action: str  # write | symlink | mkdir | chmod | delete (fs/promote.Op's actions)
    kind: str | None  # what the path becomes: file | dir | symlink; None when deleted
    mode: int | None = None  # the permission bits it gets (write, mkdir, chmod)
    old_mode: int | None = None  # its bits in the workspace, if it is there as the same kind


@dataclass(frozen=True)
class Hazard:
    """One thing the promotion would carry out that runs or escalates on the host."""

    kind: str  # a key of KINDS
    path: str
    action: str
    reason: str
    allowed: bool = False  # named in allow_hazards

    def to_json(self) -> dict[str, Any]:
        """The policy report's entry."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ConfigNamed:
    """A path of the workspace that the host's git config names: config git reads, or code it runs."""

    path: str  # workspace-relative ("" is the workspace itself)
    key: str  # the key that names it, e.g. "include.path", "filter.lfs.clean"
    origin: str  # the config file that holds the key
    use: str  # what git does with it, for the hazard's reason
    subtree: bool = False  # a directory everything in which counts (core.hooksPath)


@dataclass(frozen=True)
class Autorun:
    """Paths a tool runs or obeys by itself, at any depth (casefolded names, ``*`` at most once in
    each; a trailing ``/**``: that directory and everything below it)."""

    patterns: tuple[str, ...]
    reason: str


AUTORUN: tuple[Autorun, ...] = (
    Autorun((".envrc",), "direnv sources it into the shell on cd (once allowed, by the habit of `direnv allow`)"),
    Autorun((".env",), "pipenv and VS Code's Python extension load it into the environment of what they run: "
                       "LD_PRELOAD, NODE_OPTIONS or PYTHONSTARTUP there run code"),
    Autorun((".vscode/**", "*.code-workspace"), "VS Code runs tasks.json tasks on folder open, and settings name the "
                                                "programs its extensions start (interpreters, linters, terminal env)"),
    Autorun((".idea/**",), "JetBrains IDEs read run configurations, external tools and startup tasks from it"),
    Autorun((".devcontainer/**", ".devcontainer.json"),
            "dev containers run initializeCommand on the host as they open"),
    Autorun((".gitmodules",), "git submodule update fetches from the URLs and writes to the paths it names (the way "
                              "into CVE-2018-11235, CVE-2019-19604, CVE-2024-32002)"),
    Autorun((".husky/**",), "husky points core.hooksPath here: its files are git hooks"),
    Autorun((".pre-commit-config.yaml",), "pre-commit, run by the git hook it installs, runs each hook's entry"),
    Autorun((".tool-versions", "mise.toml", ".mise.toml", "mise.*.toml", ".mise.*.toml", ".mise/**",
             "mise/config.toml", ".config/mise.toml", ".config/mise/**"),
            "asdf and mise choose (and install) the programs run as the tools it names; mise runs its hooks on cd"),
    Autorun((".npmrc",), "npm runs every package script with the script-shell and node-options it sets"),
    Autorun((".yarnrc.yml", ".yarnrc"), "yarn runs the file its yarnPath names as yarn itself, on every command"),
    Autorun((".pnpmfile.cjs",), "pnpm runs its hooks on every install"),
    Autorun((".cargo/config.toml", ".cargo/config"), "cargo runs the rustc-wrapper and target runners it names"),
    Autorun((".exrc", ".vimrc", ".gvimrc", ".nvimrc", ".nvim.lua"), "vim and neovim source it when started here "
                                                                     "with 'exrc' set"),
    Autorun((".hg/hgrc",), "Mercurial runs the hooks it names on commit, pull and update"),
    Autorun((".jj/repo/config.toml",), "jj runs the pager, editor and fix tools it names"),
)

# What a git directory holds that names no program: object and ref data.  Paths relative to
# the git directory, casefolded, patterns as in AUTORUN; everything else in it is git_control.
GIT_DATA = ("objects/**", "refs/**", "logs/**", "index", "head", "orig_head", "fetch_head", "merge_head",
            "merge_msg", "merge_mode", "auto_merge", "cherry_pick_head", "revert_head", "commit_editmsg",
            "packed-refs", "shallow", "description", "info", "info/exclude", "rr-cache/**", "lfs", "lfs/objects/**")
# Under objects/ and refs/ but not data: alternates send git to read objects from other places, and a
# replace ref has git show, check out and archive another object in place of the one it names.
GIT_NOT_DATA = ("objects/info/alternates", "objects/info/http-alternates", "refs/replace/**")
# A loose object's file in a git directory: objects/ab/<the rest of a SHA-1 or SHA-256 id>.
_LOOSE = re.compile(r"objects/([0-9a-f]{2})/([0-9a-f]{38}|[0-9a-f]{62})")
MAX_CHECKED_OBJECT = 256 << 20  # a loose object larger than this is not inflated to check it: a hazard
# What makes a directory a repository to git (setup.c: is_git_directory): HEAD, and objects and
# refs in its common directory, which is itself unless a `commondir` file names another.  Git
# reads that other directory's config and hooks too, and needs no HEAD there.  So a directory
# with HEAD and `commondir` is one (a repository pointer, as a `.git` file is), and so is one
# with objects and refs (a repository, or the common directory such a pointer may name):
# either pair alone marks it, whichever directory holds the other half.
GITDIR_MARKS = (("objects", "refs"), ("HEAD", "commondir"))


def looks_like_gitdir(present: Callable[[str], bool]) -> bool:
    """Whether a directory is (or is the common directory of) a repository to git; ``present``
    says whether it holds an entry of that name, of any kind."""
    return any(all(map(present, marks)) for marks in GITDIR_MARKS)


Pattern = tuple[tuple[str, ...], bool]  # parsed: the names, and whether the subtree counts


def _parse(pattern: str) -> Pattern:
    """A pattern's name globs (``*``: any run of characters, at most once per name) and whether ``/**`` ends it."""
    subtree = pattern.endswith("/**")
    segments = tuple((pattern[:-3] if subtree else pattern).split("/"))
    assert all(s.count("*") <= 1 for s in segments), pattern
    return segments, subtree


def _name_matches(glob: str, name: str) -> bool:
    head, star, tail = glob.partition("*")
    if not star:
        return name == glob
    return len(name) >= len(head) + len(tail) and name.startswith(head) and name.endswith(tail)


def _prefix_matches(segments: tuple[str, ...], parts: list[str]) -> bool:
    """Whether ``parts`` begin with names matching ``segments`` (as far as ``parts`` go)."""
    return all(_name_matches(s, part) for s, part in zip(segments, parts, strict=False))


def _covers(pattern: Pattern, parts: list[str]) -> bool:
    """Whether a parsed pattern, anchored at the first of ``parts``, names that path."""
    segments, subtree = pattern
    if len(parts) < len(segments) or (len(parts) > len(segments) and not subtree):
        return False
    return _prefix_matches(segments, parts)


def _by_first_name(rules: Iterable[Autorun]) -> tuple[dict[str, list[tuple[Pattern, Autorun]]],
                                                      list[tuple[Pattern, Autorun]]]:
    """The rules' patterns by their first name, and apart those whose first name has a ``*``.

    A path is then tried only from the names that can begin a pattern (a dict lookup and
    the few starred ones), not against every pattern: 50,000 paths take a fraction of a
    second, not seconds.
    """
    exact: dict[str, list[tuple[Pattern, Autorun]]] = {}
    starred: list[tuple[Pattern, Autorun]] = []
    for rule in rules:
        for pattern in map(_parse, rule.patterns):
            if "*" in pattern[0][0]:
                starred.append((pattern, rule))
            else:
                exact.setdefault(pattern[0][0], []).append((pattern, rule))
    return exact, starred


_AUTORUN_BY_FIRST, _AUTORUN_STAR_FIRST = _by_first_name(AUTORUN)
# Whether a name can begin one of the starred patterns: one C call for the common "no".
_STAR_FIRST_RE = re.compile("|".join(
    re.escape(first).replace(r"\*", ".*") for first in sorted({p[0][0] for p, _ in _AUTORUN_STAR_FIRST})), re.DOTALL)
_GIT_NOT_DATA = tuple(map(_parse, GIT_NOT_DATA))
_GIT_DATA_BY_FIRST = {first: [p for p in map(_parse, GIT_DATA) if p[0][0] == first] for first in
                      {_parse(p)[0][0] for p in GIT_DATA}}


def gitdir_candidates(paths: Iterable[str]) -> list[str]:
    """Directories whose look (``looks_like_gitdir``) decides whether a changed path is in a repository.

    Every ancestor of every path ("" is the workspace), except those in a ``.git``
    (which is a repository by its name).  A repository's own directory is among them as
    soon as anything in it changed.
    """
    out = {""}
    for path in paths:
        parts = path.split("/")
        for n in range(1, len(parts)):
            if parts[n - 1].casefold() == ".git":
                break
            out.add("/".join(parts[:n]))
    return sorted(out)


def find(changes: Iterable[Change], bare_gitdirs: Collection[str] = (),
         config_named: Iterable[ConfigNamed] = (), checked_data: Collection[str] = (),
         on_path: Mapping[str, str] | None = None, moved: Mapping[str, str] | None = None) -> list[Hazard]:
    """Every hazard among ``changes``, sorted by path; ``bare_gitdirs``: directories that look like repositories;
    ``config_named``: the paths the host's git config names; ``checked_data``: the written git data whose bytes
    the caller found plain (``true_loose_object``, ``plain_packed_refs``), the only such data (``_UNCHECKED``)
    written without a hazard; ``on_path``: the changed paths that the promoting user's PATH would run, with
    why (fs/gitconfig.py ``on_path``); ``moved``: why changed git data means other than it reads (a ref
    moved, core/refmoves.py ``reasons``; an index staging unseen content, capsules/gitindex.py)."""
    named, moved = _NamedIndex.of(config_named), moved or {}
    found: dict[tuple[str, str, str], Hazard] = {}
    for change in changes:
        folded = change.path.casefold().split("/")
        for hazard in (_setuid(change), _world_writable(change), named.hazard(change, folded),
                       _git_control(change, folded, bare_gitdirs, checked_data, moved) or _autorun(change, folded)
                       or _on_path(change, on_path or {})):
            if hazard is not None:
                found.setdefault((hazard.kind, hazard.path, hazard.action), hazard)
    return sorted(found.values(), key=lambda h: (h.path.encode("utf-8", "surrogateescape"), h.kind, h.action))


def judge(found: Iterable[Hazard], allow: Collection[str]) -> list[Hazard]:
    """``found`` with each hazard whose kind ``allow`` names marked allowed."""
    return [dataclasses.replace(h, allowed=h.kind in allow) for h in found]


def _setuid(change: Change) -> Hazard | None:
    if change.action not in ("write", "chmod") or change.kind != "file" or not (change.mode or 0) & SETID_BITS:
        return None
    assert change.mode is not None
    names = [name for bit, name in ((0o4000, "setuid"), (0o2000, "setgid")) if change.mode & bit]
    bits = " and ".join(names) + (" bits" if len(names) > 1 else " bit")
    return Hazard("setuid", change.path, change.action,
                  f"mode {change.mode:04o}: the {bits} would make it run with its owner's privileges (the "
                  "promoting user's; root's when ccw runs as root) whoever starts it")


def _world_writable(change: Change) -> Hazard | None:
    mode = change.mode or 0
    if change.action not in ("write", "chmod", "mkdir") or change.kind not in ("file", "dir"):
        return None
    if not mode & _WORLD_WRITE or (change.kind == "dir" and mode & _STICKY):
        return None
    if change.old_mode is not None and change.old_mode & _WORLD_WRITE:
        return None  # already so in the workspace
    return Hazard("world_writable", change.path, change.action,
                  f"mode {mode:04o}: any local user could change it, and so what runs from it")


def _gitdir_depth(parts: list[str], folded: list[str], bare_gitdirs: Collection[str]) -> int | None:
    """How many of ``parts`` name the innermost git directory the path is in (or is), or None."""
    if ".git" not in folded and not bare_gitdirs:
        return None  # the common case, without a join per ancestor
    return next((n for n in range(len(parts), -1, -1)
                 if (n and folded[n - 1] == ".git") or (bare_gitdirs and "/".join(parts[:n]) in bare_gitdirs)), None)


# Git data whose bytes can give an existing name other content: written, each is a hazard unless the
# caller read it and found it plain (``checked_data``).  By its first name in the git directory, or its path.
_UNCHECKED = {
    "objects": ("object data whose bytes were not checked against its name: git takes a loose object, a pack "
                "and its index, a commit-graph at their word, so one can give an existing commit or file other "
                "content where no diff shows it (a capsule's git gc or fetch makes packs: check them with git "
                "verify-pack before allowing)"),
    "packed-refs": ("packed refs naming a replace ref (refs/replace/): git shows, checks out and archives "
                    "another object in place of the one it names"),
}


def plain_packed_refs(data: bytes) -> bool:
    """Whether a ``packed-refs`` file names no replace ref (anywhere in it: nothing else there looks so)."""
    return b"refs/replace/" not in data


def loose_object_id(path: str, bare_gitdirs: Collection[str] = ()) -> str | None:
    """The object id ``path`` names if it is a loose object's file in a git directory, else None."""
    found = _LOOSE.fullmatch((in_gitdir(path, bare_gitdirs) or ("", ""))[1])
    return None if found is None else found[1] + found[2]


def in_gitdir(path: str, bare_gitdirs: Collection[str] = ()) -> tuple[str, str] | None:
    """The innermost git directory ``path`` is in and its path there (None: in none, or it is one)."""
    parts = path.split("/")
    depth = _gitdir_depth(parts, path.casefold().split("/"), bare_gitdirs)
    return None if depth is None or depth == len(parts) else ("/".join(parts[:depth]), "/".join(parts[depth:]))


def true_loose_object(oid: str, data: bytes) -> bool:
    """Whether ``data`` is a loose object (zlib of ``TYPE SIZE\\0BODY``) that hashes to ``oid`` (SHA-1 or, by
    its length, SHA-256); inflated a piece at a time, never past its header's size or MAX_CHECKED_OBJECT."""
    try:
        return _hashes_to(oid, data)
    except zlib.error:
        return False


def _hashes_to(oid: str, data: bytes) -> bool:
    inflate = zlib.decompressobj()
    head = inflate.decompress(data, 64)
    kind, space, rest = head.partition(b" ")
    size_text, nul, body = rest.partition(b"\0")
    if kind not in (b"blob", b"tree", b"commit", b"tag") or not (space and nul and size_text.isdigit()):
        return False
    size = int(size_text)
    if size > MAX_CHECKED_OBJECT:
        return False
    digest = (hashlib.sha1 if len(oid) == 40 else hashlib.sha256)(head)
    seen = len(body)
    while seen <= size and inflate.unconsumed_tail:
        piece = inflate.decompress(inflate.unconsumed_tail, 1 << 20)
        digest.update(piece)
        seen += len(piece)
    if seen <= size:
        piece = inflate.flush()
        digest.update(piece)
        seen += len(piece)
    return seen == size and inflate.eof and not inflate.unused_data and digest.hexdigest() == oid


def _git_control(change: Change, folded: list[str], bare_gitdirs: Collection[str],
                 checked_data: Collection[str], moved: Mapping[str, str]) -> Hazard | None:
    parts = change.path.split("/")
    depth = _gitdir_depth(parts, folded, bare_gitdirs)
    if depth is None:
        return None
    if depth == len(parts):
        reason = ("a .git file (gitdir:) or directory decides which repository, config and hooks git uses here"
                  if folded[-1] == ".git" else "a directory git takes for a repository (HEAD with a commondir, or "
                  "objects and refs), with its config and hooks")
        return Hazard("git_control", change.path, change.action, reason)
    if change.kind == "symlink":  # git makes none there (an old symlinked HEAD aside): data or not, it leads out
        return Hazard("git_control", change.path, change.action,
                      "a link in a git directory: git reads objects, refs and its other files through it (an "
                      "objects/info link brings its alternates), and writes refs and logs through it, wherever "
                      "it points")
    rel = folded[depth:]
    data = any(_covers(pattern, rel) for pattern in _GIT_DATA_BY_FIRST.get(rel[0], ()))
    if data and not any(_covers(pattern, rel) for pattern in _GIT_NOT_DATA):
        why = _UNCHECKED.get(rel[0] if rel[0] == "objects" else "/".join(rel))
        if why is None or change.action != "write" or change.path in checked_data:
            why = moved.get(change.path)  # data as plain as it reads, but naming another commit or blob
        return None if why is None else Hazard("git_control", change.path, change.action, why)
    if folded[depth] == "hooks":
        reason = "a git hook: git runs it on commit, merge, checkout or push"
    elif rel[-1] in ("config", "config.worktree"):
        reason = ("git config: core.hooksPath, core.fsmonitor, core.pager and filter or diff drivers name "
                  "programs git runs")
    else:
        reason = "git reads it to decide what to run or where its repository is (it is not object or ref data)"
    return Hazard("git_control", change.path, change.action, reason)


@dataclass(frozen=True)
class _NamedIndex:
    """The config-named paths by casefolded path: themselves, the hooks directories, and the directories on
    their way (where a link would stand in for one), so a change costs a few dict lookups."""

    exact: dict[str, ConfigNamed]
    subtrees: dict[str, ConfigNamed]
    on_the_way: dict[str, ConfigNamed]

    @classmethod
    def of(cls, named: Iterable[ConfigNamed]) -> _NamedIndex:
        """The index of ``named``; the first to name a path is the one a hazard cites."""
        exact: dict[str, ConfigNamed] = {}
        subtrees: dict[str, ConfigNamed] = {}
        on_the_way: dict[str, ConfigNamed] = {}
        for one in named:
            folded = one.path.casefold()
            exact.setdefault(folded, one)
            if one.subtree:
                subtrees.setdefault(folded, one)
            parts = folded.split("/") if folded else []
            for n in range(1, len(parts)):
                on_the_way.setdefault("/".join(parts[:n]), one)
        return cls(exact, subtrees, on_the_way)

    def hazard(self, change: Change, folded: list[str]) -> Hazard | None:
        """The hazard of a change to a named path, to anything in a named hooks directory, or of a link on the way."""
        if not self.exact:  # which holds every named path, the subtrees' included
            return None
        path = "/".join(folded)
        one = self.exact.get(path)
        if one is None and self.subtrees:
            one = next((self.subtrees[p] for p in ("/".join(folded[:n]) for n in range(len(folded) - 1, -1, -1))
                        if p in self.subtrees), None)
        if one is not None:
            return Hazard("git_control", change.path, change.action,
                          f"the host's git config names it ({one.key} in {one.origin}): {one.use}")
        one = self.on_the_way.get(path) if change.kind == "symlink" else None
        if one is None:
            return None
        return Hazard("git_control", change.path, change.action,
                      f"a link on the way to {one.path}, which the host's git config names ({one.key} in "
                      f"{one.origin}): {one.use}")


def _autorun(change: Change, folded: list[str]) -> Hazard | None:
    is_link = change.kind == "symlink"
    for start, name in enumerate(folded):
        starting = _AUTORUN_BY_FIRST.get(name, [])
        if _STAR_FIRST_RE.fullmatch(name):
            starting = starting + [(p, rule) for p, rule in _AUTORUN_STAR_FIRST if _name_matches(p[0][0], name)]
        tail = folded[start:] if starting else []
        for pattern, rule in starting:
            # A link whose path is a leading part of a listed path stands in for a directory on its way.
            standing_in = is_link and len(tail) < len(pattern[0]) and _prefix_matches(pattern[0], tail)
            if standing_in or _covers(pattern, tail):
                return Hazard("autorun", change.path, change.action, rule.reason)
    return None


def _on_path(change: Change, on_path: Mapping[str, str]) -> Hazard | None:
    why = on_path.get(change.path) if change.kind in ("file", "symlink") else None
    return None if why is None else Hazard("autorun", change.path, change.action, why)


def report_reasons(found: Sequence[Hazard]) -> tuple[list[str], list[str]]:
    """The policy report's ``details`` clauses for ``found``: (what is refused and how to
    allow it, what was allowed)."""
    refused = [h for h in found if not h.allowed]
    allowed = [h for h in found if h.allowed]
    failures, notes = [], []
    if refused:
        kinds = sorted({h.kind for h in refused})
        first = refused[0]
        failures.append(f"{len(refused)} hazard(s), what would run or escalate on the host: {_listed(refused)}; "
                        f"{first.path}: {first.reason}. Review them (dry_run lists each) and undo them in the "
                        f"capsule, or promote with allow_hazards {json_list(kinds)} ({_effects(kinds)})")
    if allowed:
        kinds = sorted({h.kind for h in allowed})
        notes.append(f"note: {len(allowed)} hazard(s) allowed (allow_hazards {json_list(kinds)}): "
                     f"{_listed(allowed)}; {_effects(kinds)}")
    return failures, notes


def json_list(names: Iterable[str]) -> str:
    """``["a", "b"]``, as an agent would pass it."""
    return "[" + ", ".join(f'"{name}"' for name in names) + "]"


def _listed(found: Sequence[Hazard], shown: int = 5) -> str:
    return ", ".join(f"{h.path} ({h.kind})" for h in found[:shown]) + (", …" if len(found) > shown else "")


def _effects(kinds: Iterable[str]) -> str:
    return "; ".join(f"{kind}: {KINDS[kind][1]}" for kind in kinds)
