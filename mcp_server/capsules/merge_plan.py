"""What a merge of several capsules gives, path by path, read through their roots (capsule_merge).

Each capsule's change is what the helper lists against the capsule's base directory
(its lowest layer: the workspace or a snapshot), expanded as promotion expands it
(fs/changeset.py).  The paths any of them changed, and those their common ancestor
changed, are every path where the merge can differ from the merge base; at each one the
base's state and every capsule's are read (kind, mode, bytes or link target) and
merged by capsules/merge3.py.  Reading happens in a worker thread; the views are the
O_PATH roots the helper passed, so nothing is followed out of any of them.

The base directory's bytes are read only where they can matter: at paths two sides name
(where ``git merge-file`` may need them) and wherever the common ancestor changed
something.  Elsewhere one side at most changed the path, and the merge only asks whether
that side holds the base's bytes: a digest answers, and the stat cache (fs/statcache.py,
git's index for the base directory) gives it for an ``lstat`` where the file was hashed
before and not written since.  The live check (capsules/merge.py) compares the same digests.

After the paths, the tree as a whole: a path kept in the merge must have a directory
for a parent in the merge too.  A capsule that replaced ``src/`` with a symlink while
another added ``src/new.py`` conflicts on ``src/new.py``; merged regardless, the add
would be written through the link.  A directory one side deleted while another added a
path below it stays, as that side has it: git holds files, not directories, and
deleting every file below one leaves room for another side's new file there.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations

from mcp_server.capsules.merge3 import ABSENT, Outcome, State, merge_path
from mcp_server.fs import changeset
from mcp_server.fs.statcache import StatCache, digest_of
from mcp_server.fs.view import DirFds, RootView
from mcp_server.fs.view import Side as ViewSide
from sandbox.errors import CcwError, from_oserror
from sandbox.replies import Change

READERS = 2  # trees read at once: this VM's cores


@dataclass(frozen=True)
class Side:
    """One capsule as the merge reads it: its name (id), its root and the helper's change list."""

    name: str
    root_fd: int
    changes: Sequence[Change]


@dataclass
class Plan:
    """Every path that may differ from the merge base: its base state and its outcome."""

    base: dict[str, State] = field(default_factory=dict)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    sides: dict[str, dict[str, State]] = field(default_factory=dict)  # capsule -> path -> state
    lower: dict[str, State] = field(default_factory=dict)  # the capsules' base directory (``base`` without an ancestor)
    mtimes: dict[str, dict[str, int]] = field(default_factory=dict)  # capsule -> path -> its file's mtime (ns), as read
    unlisted: dict[str, frozenset[str]] = field(default_factory=dict)  # donor -> ChangesReply.unlisted
    opaque: dict[str, set[str]] = field(default_factory=dict)  # capsule -> the directories its list says it replaced

    @property
    def conflicts(self) -> list[Outcome]:
        """The paths that could not be merged, in path order."""
        return [one for one in self.outcomes.values() if one.conflict]

    @cached_property
    def changed(self) -> list[Outcome]:
        """The merged paths whose state differs from the base, in path order (worked out once, asked
        for by the report and the write: read only once ``read_plan`` has made the plan whole)."""
        return [one for one in self.outcomes.values() if not one.conflict and one.state != self.base[one.path]]


def _key(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


def heads_of(paths: Iterable[str]) -> set[str]:
    """Every directory above any of ``paths`` (the root as ""), each once."""
    heads = {path.rpartition("/")[0] for path in paths}
    for head in list(heads):
        while "/" in head:
            head = head.rpartition("/")[0]
            heads.add(head)
    return heads


def below_any(path: str, tops: Set[str]) -> bool:
    """Whether a directory above ``path`` is one of ``tops``."""
    return bool(tops) and any(path[:i] in tops for i, char in enumerate(path) if char == "/")


def _state(dirs: DirFds, path: str, side: ViewSide | None) -> State:
    """The state ``expand`` found at ``path`` (``side``), with a file's bytes read through ``dirs``."""
    if side is None:
        return ABSENT
    if side.kind == "file":
        return State("file", side.mode, dirs.read_regular(path, missing_ok=False))
    return State(side.kind, side.mode, None, side.target)


def _states(view: RootView, found: dict[str, ViewSide | None]) -> tuple[dict[str, State], dict[str, int]]:
    """The states ``expand`` found at these paths of ``view``, files' bytes read, in path order, and each
    file's mtime as read (a merged capsule forked from this side holds the same file there: merge_write
    journals that mtime without a stat of its own)."""
    states: dict[str, State] = {}
    mtimes: dict[str, int] = {}
    with DirFds(view) as dirs:
        for path in sorted(found, key=_key):
            side = found[path]
            if side is not None and side.kind == "file":
                read = dirs.read_stat(path, missing_ok=False)
                assert read is not None
                states[path], mtimes[path] = State("file", side.mode, read[0]), read[1].st_mtime_ns
            else:
                states[path] = _state(dirs, path, side)
    return states, mtimes


def _base_state(dirs: DirFds, path: str, side: ViewSide | None, cache: StatCache, needed: bool,
                info: os.stat_result | None) -> State:
    """The base directory's state at ``path``: a file's bytes where ``needed`` or not in ``cache``
    (and then kept there), else its digest from the cache alone; ``info``: its lstat as ``expand``
    took it (after the cache's ``since_ns``, before any read), stat'ed here where it has none."""
    if side is None or side.kind != "file":
        return _state(dirs, path, side)
    if info is None:
        head, _, name = path.rpartition("/")
        try:  # not ``wrap_oserror``: its generator-based context costs several times the stat, 2,000 a merge
            info = os.stat(name, dir_fd=dirs.get(head, "read"), follow_symlinks=False)
        except OSError as exc:
            raise from_oserror(exc, "merge: stat the base", path) from exc
    known = cache.digest(path, info)
    if known is not None and not needed:
        return State("file", side.mode, None, None, known)
    if not stat.S_ISREG(info.st_mode):
        return _state(dirs, path, side)  # replaced since ``expand`` looked: refused there as a non-file
    data = dirs.read_regular(path, missing_ok=False)
    assert data is not None
    if known is None:
        cache.add(path, info, digest_of(data))
    return State("file", side.mode, data)


def _base_states(view: RootView, found: dict[str, ViewSide | None], needed: set[str],
                 cache: StatCache, infos: dict[str, os.stat_result]) -> dict[str, State]:
    """``_states`` of the base directory, each file's bytes read only where ``needed`` (or not cached);
    ``infos``: the files' lstat as ``expand`` took them."""
    with DirFds(view) as dirs:
        return {path: _base_state(dirs, path, found[path], cache, path in needed, infos.get(path))
                for path in sorted(found, key=_key)}


def _needing_bytes(named: dict[str, dict[str, ViewSide | None]], ancestor: str | None) -> set[str]:
    """The paths where the base directory's bytes may be merged or written: named by two sides, or by
    the common ancestor (an input that undid its change holds the base directory's bytes there)."""
    seen: set[str] = set()
    twice: set[str] = set(named[ancestor]) if ancestor else set()
    for paths in named.values():
        twice |= seen & paths.keys()
        seen |= paths.keys()
    return twice


def _conflicts_read(plan: Plan, low: RootView) -> None:
    """The base directory's bytes at conflicting paths read where only a digest was (a report says
    whether a file is binary), if they are still the bytes digested."""
    unread = {one.path for one in plan.conflicts if plan.lower[one.path].kind == "file"
              and plan.lower[one.path].data is None}
    with DirFds(low) as dirs:
        for path in sorted(unread, key=_key):
            digested = plan.lower[path]
            data = dirs.read_regular(path)
            if data is None or digest_of(data) != digested.digest:
                continue
            full = State("file", digested.mode, data)
            for states in (plan.lower, plan.base, *plan.sides.values()):
                if states.get(path) is digested:
                    states[path] = full


@dataclass(frozen=True)
class SideRead:
    """One capsule's change as read through its view: the state ``expand`` found under each path it
    names (``named``: new, ``olds``: the base directory's), those paths' states with files' bytes,
    and each file's mtime as read (``_states``)."""

    named: dict[str, ViewSide | None]
    olds: dict[str, ViewSide | None]
    states: dict[str, State]
    mtimes: dict[str, int]
    unread: set[str] = field(default_factory=set)  # listed files whose bytes were left in the view (``lazy``)
    opaque: set[str] = field(default_factory=set)  # directories listed as replaced (opaque: nothing of the base below)


def unread(state: State) -> bool:
    """Whether ``state`` is a file whose bytes a lazy ``read_side`` left in its view (no bytes, no digest)."""
    return state.kind == "file" and state.data is None and state.known_digest is None


STRUCTURAL = ("deleted", "opaque", "type_changed")  # changes whose base side ``expand`` widens to descendants


def _read_listed(low: RootView, view: RootView, changes: Sequence[Change], infos: dict[str, os.stat_result],
                 read: SideRead, lazy: bool) -> list[Change]:
    """The files the helper listed as modified or added, read in one open each (its ``fstat`` gives
    the new state ``expand`` would ``lstat`` for), with the base's state under them, into ``read``;
    the changes left for ``expand``: every other kind, a file below a structural change (``expand``
    names it as its directory's descendant), and one no longer a regular file.  ``lazy``: such a
    file is taken as the helper listed it, its bytes left unread (``SideRead.unread``)."""
    structural = {change.path for change in changes if change.kind in STRUCTURAL}
    rest: list[Change] = []
    with DirFds(view) as dirs, DirFds(low) as base_dirs:
        for change in changes:
            path = change.path
            got = None
            if change.kind in ("modified", "added") and change.type == "file" and change.mode is not None and not (
                    below_any(path, structural)):
                got = (None, change.mode, change.mtime_ns) if lazy else _stat_read(dirs, path)
            if got is None:
                rest.append(change)
                continue
            data, mode, mtime = got
            read.named[path] = ViewSide("file", mode, None)
            read.states[path] = State("file", mode, data)
            if data is None:
                read.unread.add(path)
            if mtime is not None:  # lazily, as listed (ChangesRequest ``mtimes``): the view shows that file
                read.mtimes[path] = mtime
            old, info = base_dirs.lstat_info(path)
            if old is not None and old.kind == "file" and info is not None:
                infos[path] = info
            read.olds[path] = old
    return rest


def _stat_read(dirs: DirFds, path: str) -> tuple[bytes, int, int] | None:
    """A regular file's bytes, mode and mtime, read in one open; None for anything else."""
    got = dirs.read_stat(path)
    return None if got is None else (got[0], stat.S_IMODE(got[1].st_mode), got[1].st_mtime_ns)


def read_side(low: RootView, side: Side, infos: dict[str, os.stat_result], lazy: bool = False) -> SideRead:
    """``expand`` one capsule's change list against the base directory ``low`` and read the states
    it names (files' bytes too); its root is closed.  ``infos`` gathers the base files' lstat, as
    ``expand`` took them, for ``combine`` (one dict for all sides: each entry is one atomic store).
    The files listed as modified or added are read first, each in one open (``_read_listed``: a
    merge's inputs list little else, and an ``lstat`` on overlayfs costs a third of a read); with
    ``lazy`` they are not read at all, until ``read_unread`` reads those a merge needs."""
    read = SideRead({}, {}, {}, {}, opaque={change.path for change in side.changes if change.kind == "opaque"})
    with RootView.from_fd(side.root_fd) as view:
        rest = _read_listed(low, view, side.changes, infos, read, lazy)
        entries = changeset.expand(rest, low, view, infos)
        named = {entry.path: entry.new for entry in entries}
        states, mtimes = _states(view, named)
    read.named.update(named)
    read.olds.update((entry.path, entry.old) for entry in entries)
    read.states.update(states)
    read.mtimes.update(mtimes)
    return read


def needing_bytes(reads: dict[str, SideRead], inputs: list[str], ancestor: str | None,
                  unlisted: dict[str, frozenset[str]]) -> dict[str, set[str]]:
    """The files a lazy ``read_side`` left unread whose bytes a merge needs, by input: where two sides
    (or the common ancestor) name the path, its bytes are merged; where another input names it, a
    directory above it, or holds it unnamed (``unlisted``), a capsule stacking their layers may show
    it otherwise than the merge, and it is written (merge_write.stacked_start)."""
    every = [*inputs, *([ancestor] if ancestor else [])]
    twice = _needing_bytes({name: reads[name].named for name in every}, ancestor)
    hiders = {name: reads[name].named.keys() | unlisted.get(name, frozenset()) for name in inputs}
    heads = heads_of(path for name in inputs for path in reads[name].unread)
    above = {name: hiders[name] & heads for name in inputs}
    needed: dict[str, set[str]] = {}
    for name in inputs:
        others = [other for other in inputs if other != name]
        needed[name] = {path for path in reads[name].unread if path in twice or any(
            path in unlisted.get(other, ()) or below_any(path, above[other]) for other in others)}
    return needed


def read_unread(root_fd: int, read: SideRead, paths: set[str]) -> None:
    """Read the bytes of ``paths``, files a lazy ``read_side`` left unread, through the view ``root_fd``
    (closed after) into ``read``; refused where one is no longer a regular file."""
    with RootView.from_fd(root_fd) as view, DirFds(view) as dirs:
        for path in sorted(paths, key=_key):
            got = _stat_read(dirs, path)
            if got is None:
                raise CcwError("CONFLICT", f"{path} is no longer a regular file in the capsule it was listed in "
                               "(it changed while it was merged): nothing was made; merge again", {"path": path})
            data, mode, mtime = got
            read.named[path] = ViewSide("file", mode, None)
            read.states[path], read.mtimes[path] = State("file", mode, data), mtime
            read.unread.discard(path)


def combine(low: RootView, sides: list[str], ancestor: str | None, reads: dict[str, SideRead],
            cache: StatCache, infos: dict[str, os.stat_result]) -> Plan:
    """The plan from each capsule's ``read_side`` (``sides``: the inputs' names in order, ``ancestor``:
    their common ancestor's, or None where the merge base is ``low`` itself): the base directory read
    under every path any of them names, its bytes only where ``_needing_bytes`` says (``cache``: its
    stat cache), then each path merged."""
    every = [*sides, *([ancestor] if ancestor else [])]
    named = {name: reads[name].named for name in every}
    olds = {path: old for name in every for path, old in reads[name].olds.items()}
    ordered = sorted(olds, key=_key)
    under = _base_states(low, olds, _needing_bytes(named, ancestor), cache, infos)
    read = {name: {path: reads[name].states.get(path, under[path]) for path in ordered} for name in every}
    plan = Plan(base=read[ancestor] if ancestor else under, sides={name: read[name] for name in sides}, lower=under,
                mtimes={name: reads[name].mtimes for name in every},
                opaque={name: reads[name].opaque for name in every})
    for path in ordered:
        plan.outcomes[path] = merge_path(path, plan.base[path], [(name, plan.sides[name][path]) for name in sides])
    _parents_hold(plan)
    _conflicts_read(plan, low)
    return plan


def read_plan(lower: str, sides: list[Side], ancestor: Side | None, cache: StatCache | None = None) -> Plan:
    """Read and merge: ``lower`` the capsules' base directory; the merge base is their common
    ``ancestor`` capsule's view, or ``lower`` itself when they have none.  The roots are closed.

    A view holds the lower directory's state at every path its change list does not name,
    so only the paths it names are read from it (a fork's list names its parent's changes
    too, and a change it undid is a path its parent's list names).  ``expand`` has already
    looked at each named path in both trees: only files' bytes are read after it, and the base
    directory's only where ``_needing_bytes`` says (``cache``: its stat cache, none kept without).
    The trees are read ``READERS`` at a time (the reads are syscalls: threads overlap on two
    cores); capsules/merge.py reads each as soon as the helper has listed it instead."""
    every = [*sides, *([ancestor] if ancestor else [])]
    handed = 0
    try:
        with RootView.open(lower) as low, ThreadPoolExecutor(READERS) as pool:
            infos: dict[str, os.stat_result] = {}
            jobs = []
            for side in every:
                jobs.append(pool.submit(read_side, low, side, infos))
                handed += 1
            reads = {side.name: job.result() for side, job in zip(every, jobs, strict=True)}
            return combine(low, [side.name for side in sides], ancestor.name if ancestor else None, reads,
                           cache or StatCache(lower), infos)
    finally:
        for side in every[handed:]:
            os.close(side.root_fd)


def _parents_hold(plan: Plan) -> None:
    """A path the merge keeps needs a directory above it: where a merged parent is no directory, the
    child conflicts (named with the parent's change)."""
    for path, one in plan.outcomes.items():
        if one.conflict or one.state is None or one.state.kind is None:
            continue
        head = path
        while "/" in head:
            head = head.rpartition("/")[0]
            parent = plan.outcomes.get(head)
            if parent is None or (parent.state is not None and parent.state.kind == "dir"):
                continue
            held = _held_dir(plan, head, parent, one.sides)
            if held is not None:
                plan.outcomes[head] = held
                continue
            what = "a conflict" if parent.state is None else parent.state.describe()
            plan.outcomes[path] = Outcome(path, None, f"conflict: kept by {', '.join(one.sides) or 'the base'} "
                                          f"while its directory {head} is {what} in the merge "
                                          f"({', '.join(parent.sides)})",
                                          (*parent.sides, *one.sides))
            break


def _held_dir(plan: Plan, head: str, parent: Outcome, keepers: tuple[str, ...]) -> Outcome | None:
    """The directory ``head`` as a side that keeps a path below it has it, where the merge would delete it
    (git holds no directory: one side's deleting every path below it leaves another's new path there,
    in its directory); None where the merge puts something else there, or no such side has a directory."""
    if parent.state is None or parent.state.kind is not None:
        return None
    held = next((plan.sides[name][head] for name in keepers if plan.sides[name][head].kind == "dir"), None)
    if held is None:
        return None
    return Outcome(head, held, f"deleted on one side, kept as a directory for what {', '.join(keepers)} "
                   "put below it", (*parent.sides, *keepers))


def pairs(plan: Plan, names: list[str], passed: frozenset[str] = frozenset()) -> list[dict[str, object]]:
    """For each pair of capsules: the paths both changed, and which of those do not merge.

    ``passed``: paths whose clash the whole merge lets through (capsules/merge.py's
    ``_ignored_conflicts``: the workspace's git ignores them) make no pair conflict either, so two of
    three inputs that each compiled their own ``.pyc`` commute, as they do when merged alone."""
    out: list[dict[str, object]] = []
    for one, two in combinations(names, 2):
        ours, theirs = plan.sides[one], plan.sides[two]
        # ``is`` first: a side that did not name a path holds the base's own state there
        shared = [path for path, base in plan.base.items() if ours[path] is not base and theirs[path] is not base
                  and ours[path] != base and theirs[path] != base]
        if len(names) == 2:  # the merge itself is this pair's
            clashing = [c.path for c in plan.conflicts]
        else:
            clashing = [path for path in shared if path not in passed and merge_path(path, plan.base[path], [
                (one, plan.sides[one][path]), (two, plan.sides[two][path])]).conflict]
        out.append({"capsules": [one, two], "verdict": "conflict" if clashing else "commute",
                    "shared": len(shared), "conflicts": clashing})
    return out
