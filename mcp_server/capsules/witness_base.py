"""What a witness carries of the base: everything its runs need to start again.

A replay rebuilds the base from these entries alone (the workspace may be gone), so
they must hold every file, directory and symlink the runs depended on.  What the
journal knows (see sandbox/fanotify.py for what the kernel reports):

- ``read``/``written``/``executed``: files opened, by their *resolved* path.  The
  symlinks followed to reach them are invisible to fanotify, and so are opens of files
  outside the capsule's overlay (``/usr/bin/python3``, the target of a venv's
  ``bin/python3``).
- ``listed``: directories opened (listed); ``"."`` is the workspace root.
- each exec's cwd and argv.

Choices:

- Files recorded as read, written or executed, and every path the capsule changed, are
  carried from the base (a run that deletes or rewrites a file needs it there first),
  with mode, owner (uid and gid, which a root replayer restores: capsules/owners.py)
  and mtime: Python's ``.pyc`` files record their source's mtime, so a base
  rebuilt with fresh mtimes would make every replayed import rewrite its bytecode.
- Python never opens the source of a module whose ``.pyc`` is valid: it checks the
  source's mtime and size with ``stat``, which fanotify does not report.  Without the
  source, the rebuilt package has no ``__init__.py`` and imports as a namespace
  package.  So the source of every ``.pyc`` read (PEP 3147 naming) is carried too.
- A listed directory is carried with every direct entry: files with their bytes,
  symlinks as links, subdirectories as (empty unless otherwise needed) directories, so
  a replayed listing sees the same names.
- Every ancestor directory of a carried entry is carried with its mode, and so is each
  exec's cwd and every directory a run wrote into.  The top, the workspace directory
  itself, is no entry (entries are paths below it), but its mode and owner are what the
  jail's top shows, so they travel apart (``base_top``; capsules/owners.py says why).
- Symlinks: the base is walked once (readdir only, ``.git`` aside) and each symlink is
  resolved within the base as the kernel would.  A link is carried when its resolution
  leaves the workspace (``bin/python3 -> /usr/bin/python3``: the host provides the
  target, and whether it was followed cannot be seen), or ends at a carried or recorded
  path or an ancestor directory of one (``node_modules/.bin/jest ->
  ../jest/bin/jest.js``, ``lib64 -> lib``), together with every link on its chain
  (``bin/python -> python3``).  Paths named by argv[0], by each exec's cwd and by the
  ``#!`` line of each executed script inside the workspace are resolved the same way.
  A link is left out only when it is known to be unused: it stays inside the
  workspace and nothing at or below its target was opened.  Links are carried as links.
- When some exec's read set is unknown (rootless: ``touched.read`` is null), the whole
  base is carried (``.git`` aside).  With blobs, the bytes carried are capped
  (``max_base_bytes``); past the cap the witness is refused with ``TOO_LARGE``, naming
  the fix, rather than written half.
- What is never seen cannot be carried: a file only ``stat``-ed (never opened) is
  absent from the rebuilt base unless a rule above brings it (a tool that checks
  whether a config file exists with ``stat`` and finds it there, say).  ``make`` with
  up-to-date targets opens no source, but it lists the directories it searches, so
  their entries travel.  For runs that depend on what is never opened nor listed, the
  caller asks for the whole base (``carry_all``: ``capsule_witness`` with
  ``carry: "all"``), under the same cap.
- ``.git`` is not walked (it can be most of a tree, and "the whole base" leaves it
  out): what runs opened or listed in it (git commands) travels like anything else,
  but symlinks inside it are not looked for.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mcp_server.capsules import owners
from mcp_server.fs import changeset
from mcp_server.fs.view import RootView
from sandbox.errors import CcwError

DEFAULT_MAX_BASE_MB = 1024
_MAX_LINK_HOPS = 40  # as the kernel's MAXSYMLINKS
_SHEBANG_BYTES = 256
_SKIP = frozenset({".git"})


@dataclass
class Needs:
    """What the journal says the runs used, gathered over every exec."""

    unknown: bool = False  # some exec's read set is null: carry everything
    files: set[str] = field(default_factory=set)  # read, written, executed, changed
    listed: set[str] = field(default_factory=set)
    executed: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)  # cwds and the like: must exist as directories
    entry_points: set[str] = field(default_factory=set)  # unresolved paths (argv[0], cwd, #!)

    @classmethod
    def from_journal(cls, workspace: str, execs: list[dict[str, Any]], changed: Iterable[str]) -> Needs:
        """Gather the needs of a capsule's execs and changes."""
        needs = cls()
        needs.files.update(changed)
        for ex in execs:
            touched = ex["touched"]
            if touched["read"] is None:
                needs.unknown = True
            else:
                needs.files.update(touched["read"])
            needs.files.update(touched["written"])
            needs.listed.update(touched.get("listed") or ())
            needs.executed.update(touched.get("executed") or ())
            cwd = _inside(workspace, ex["cwd"])
            if cwd is not None:
                needs.dirs.add(cwd)
                needs.entry_points.add(cwd)
                argv0 = ex["argv"][0]
                if "/" in argv0:
                    path = argv0 if argv0.startswith("/") else os.path.join(ex["cwd"], argv0)
                    rel = _inside(workspace, path)
                    if rel is not None:
                        needs.entry_points.add(rel)
        needs.files.update(needs.executed)
        needs.files.discard(".")
        return needs


def _inside(workspace: str, path: str) -> str | None:
    """``path`` (absolute) relative to the workspace, ``"."`` for the root; None if outside."""
    norm = os.path.normpath(path)
    if norm == workspace:
        return "."
    prefix = workspace.rstrip("/") + "/"
    return norm[len(prefix):] if norm.startswith(prefix) else None


def _skipped(path: str) -> bool:
    return path.partition("/")[0] in _SKIP


def _listdir(view: RootView, path: str) -> list[tuple[str, str]]:
    try:
        return view.listdir(path)
    except CcwError:
        return []  # gone or no longer a directory: nothing of it to carry


def _ancestors(path: str) -> Iterator[str]:
    head = path.rpartition("/")[0]
    while head:
        yield head
        head = head.rpartition("/")[0]


def _walk(view: RootView, rel: str = "") -> Iterator[tuple[str, str]]:
    """Every entry below ``rel`` (directories too), as (path, kind); never follows links."""
    for name, kind in view.listdir(rel):
        if name in _SKIP and not rel:
            continue
        path = f"{rel}/{name}" if rel else name
        yield path, kind
        if kind == "dir":
            yield from _walk(view, path)


class _Resolver:
    """Resolves paths through the base's symlinks, as the kernel would, without syscalls."""

    def __init__(self, workspace: str, links: dict[str, str]) -> None:
        self.workspace = workspace
        self.links = links

    def resolve(self, path: str) -> tuple[list[str], str | None]:
        """(links followed, final repo path or None when the resolution leaves the workspace)."""
        followed: list[str] = []
        todo = [p for p in path.split("/") if p not in ("", ".")]
        todo.reverse()
        current: list[str] = []
        hops = 0
        while todo:
            part = todo.pop()
            if part == "..":
                if not current:
                    return followed, None
                current.pop()
                continue
            candidate = "/".join([*current, part])
            target = self.links.get(candidate)
            if target is None:
                current.append(part)
                continue
            hops += 1
            followed.append(candidate)
            if hops > _MAX_LINK_HOPS:
                return followed, None
            if target.startswith("/"):
                rel = _inside(self.workspace, target)
                if rel is None:
                    return followed, None
                current = []
                target = rel
            todo.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
        return followed, "/".join(current) or "."


def _pyc_source(path: str) -> str | None:
    """The source a ``__pycache__/NAME.TAG[...].pyc`` was compiled from (PEP 3147), or None."""
    head, _, name = path.rpartition("/")
    if not name.endswith(".pyc") or not (head == "__pycache__" or head.endswith("/__pycache__")):
        return None
    parent = head[: -len("__pycache__")]
    return f"{parent}{name.partition('.')[0]}.py"


def _shebang(view: RootView, path: str) -> str | None:
    """The interpreter named by a script's ``#!`` line, or None."""
    try:
        fd = view.open_fd(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, what="read")
    except CcwError:
        return None
    try:
        head = os.read(fd, _SHEBANG_BYTES)
    finally:
        os.close(fd)
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    return os.fsdecode(words[0]) if words else None


def base_entries(
    view: RootView,
    workspace: str,
    needs: Needs,
    add_file: Callable[[str], tuple[str, int]],
    max_base_bytes: int | None,
    carry_all: bool = False,
) -> list[dict[str, Any]]:
    """The manifest's ``base.files``: the entries a replay rebuilds the base from, sorted.

    ``add_file(path)`` reads a base file for the witness and returns (blob name, size);
    ``max_base_bytes`` caps their total (None: no cap, the bytes do not travel).
    ``carry_all`` carries the whole base (``.git`` aside), as unknown reads do.
    """
    base = _Walked.of(view)
    carry = set(base.kinds) if needs.unknown or carry_all else _used_entries(view, workspace, needs, base)
    carry.discard(".")
    carry.update({a for path in carry for a in _ancestors(path)})
    entries = []
    total = 0
    for path in sorted(carry, key=lambda p: p.encode("utf-8", "surrogateescape")):
        side = changeset.lstat(view, path)
        if side is None or side.kind not in ("file", "dir", "symlink"):
            continue
        kind = side.kind
        if base.kinds.get(path, kind) != kind:
            continue  # changed since the walk: what is there now is not what the runs saw
        st = view.stat(path)
        item: dict[str, Any] = {"path": path, "mode": side.mode, "type": kind, **owners.of(st)}
        if kind == "symlink":
            item["target"] = side.target
        elif kind == "file":
            item["blob"], size = add_file(path)
            item["mtime_ns"] = st.st_mtime_ns
            total += size
            if max_base_bytes is not None and total > max_base_bytes:
                raise _too_large(needs.unknown, carry_all, max_base_bytes, path)
        entries.append(item)
    return entries


def base_top(view: RootView) -> dict[str, int]:
    """The manifest's ``base.top``: the mode and owner of the base's top directory."""
    st = view.stat(".")
    return {"mode": stat.S_IMODE(st.st_mode), **owners.of(st)}


@dataclass
class _Walked:
    """The base as one walk saw it: each entry's kind, each symlink's target, each directory's entries."""

    kinds: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, view: RootView) -> _Walked:
        """Walk the base once (``.git`` aside), never following links."""
        walked = cls()
        for path, kind in _walk(view):
            walked.kinds[path] = kind
            walked.children.setdefault(path.rpartition("/")[0] or ".", []).append(path)
            if kind == "symlink":
                walked.links[path] = view.readlink(path)
        return walked


def _used_entries(view: RootView, workspace: str, needs: Needs, base: _Walked) -> set[str]:
    """The paths of the base the runs used, with the links that lead to them (see the module docstring)."""
    carry: set[str] = set()
    resolver = _Resolver(workspace, base.links)
    points = set(needs.entry_points)
    for path in needs.executed:
        interpreter = _shebang(view, path) if base.kinds.get(path) == "file" else None
        rel = _inside(workspace, interpreter) if interpreter and interpreter.startswith("/") else None
        if rel is not None:
            points.add(rel)
    used = needs.files | needs.listed | needs.dirs
    used.update(filter(None, map(_pyc_source, needs.files)))
    for point in points:
        followed, final = resolver.resolve(point)
        carry.update(followed)
        if final is not None:
            used.add(final)
    used_dirs = {a for path in used for a in _ancestors(path)} | needs.listed | needs.dirs
    for link in base.links:
        followed, final = resolver.resolve(link)
        if final is None or final in used or final in used_dirs:
            carry.update(followed)
            if final is not None:
                used.add(final)
    # .git was not walked: what the runs used in it (git commands) is taken as it is.
    carry.update(p for p in used if p in base.kinds or _skipped(p))
    carry.update(d for d in used_dirs if base.kinds.get(d) == "dir" or _skipped(d))  # where runs wrote new files
    for directory in needs.listed:
        if _skipped(directory):
            carry.update(f"{directory}/{name}" for name, _ in _listdir(view, directory))
        else:
            carry.update(base.children.get(directory, ()))
    return carry


def _too_large(unknown: bool, carry_all: bool, cap: int, path: str) -> CcwError:
    why = (
        "the runs' read sets are unknown (rootless: touched.read is null), so the witness must carry the whole base"
        if unknown else "carry: all asks for the whole base" if carry_all else "the files the runs used"
    )
    return CcwError(
        "TOO_LARGE",
        f"the witness would carry more than {cap >> 20} MiB of base files ({why}; over the cap at {path!r}). "
        "Pass a larger max_base_mb, or include_blobs: false (replays then need the live workspace unchanged)"
        + (", or run the capsule with a privileged helper so reads are recorded" if unknown else ""),
        {"max_base_mb": cap >> 20, "at": path, "read_sets_complete": not unknown},
    )
