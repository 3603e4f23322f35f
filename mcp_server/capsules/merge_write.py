"""Writing a merge into the capsule made to hold it (capsule_merge ``into: "new"``), and journaling it.

The capsule is fresh (capsules/merge_make.py makes it): a fork of the first input with the
other inputs' layers stacked over it, or, where they cannot be stacked, of the first input
alone, of the inputs' common ancestor or a new capsule over their base.  Its view is
``start`` (what the stack shows, ``stacked_start``; the first input's states; or the merge
base's), so the ops are promotion's (``changeset.promote_ops``) of each path's ``start``
state against its merged one: a stacked fork is written only where it shows something else
than the merge, as git writes only the merged branch's files into the branch checked out.
They are written through the capsule's root with parents reached without links and each
opened once (``DirFds``, ``RootView``), each file in place: created where ``start`` has no
file, truncated where it has one (``_Writer``), in the order that keeps every step well
formed (fs/promote.py's: deletions deepest first, then directories, then files and
symlinks, then modes).  Nothing is fsynced, as nothing a command writes in a capsule is:
the capsule's upper layer is as durable as an exec's writes (an fsync a file cost a merge
of 2,000 files 20 s on this VM's disk, a ``syncfs`` after them a third of the merge).
Set-id bits are written as the inputs had them: the capsule is no host tree, and
promoting it refuses them as any promotion does (core/hazards.py).

Every path the merge changes against the merge base is then journaled, written or kept
from an input alike, as a file tool's change (as capsules/notes.py's
``note_tool_changes`` does, as one batch: ``Journal.add_merge``; a directory as a replay
can redo it, see ``_rows``), with the bytes and mtimes it holds, so a witness of the merged
capsule replays from the base alone (a witness carries its capsule's own journal, not its
parent's).  A file whose bytes the merge left unread names the input whose view holds it
instead (merge_plan's lazy ``read_side``); the base states the inputs recorded are
recorded for it first, in the same transaction (the first record wins): promotion's
conflict check then asks the live tree for the states the attempts were made on, not the
ones seen at merge time.  A file kept from an input is journaled with the mtime the merge
read (or the helper listed) it with: the capsule shows that very file.  The journal's
transaction runs after the writes, not beside them: on a thread of its own it slowed the
writers more than it hid (they share its interpreter).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mcp_server.capsules.merge3 import ABSENT, State
from mcp_server.capsules.merge_plan import Plan, below_any, heads_of, unread
from mcp_server.capsules.notes import record_base_states
from mcp_server.fs import changeset
from mcp_server.fs.promote import Op, make_symlink, remove_tree
from mcp_server.fs.view import DirFds, RootView, Side, lstat, open_name
from mcp_server.journal import Journal
from sandbox.errors import CcwError, from_oserror

# Files written at once.  Each is an open (a create, or a copy-up of the file's metadata) and a write
# on overlayfs, whose syscalls overlap between two writers; four measured no faster than two (bench/parts/merge.py,
# on 2 cores, files renamed into place); with files truncated in place one measured neither faster nor slower
# (51 against 63 ms in one run, 46 against 40 in the next: 12 and 16 interleaved merges, the VM's load decides).
WRITERS = 2


def view_side(state: State) -> Side | None:
    """A merged state as ``changeset`` names one (None: absent)."""
    return None if state.kind is None else Side(state.kind, state.mode, state.target)


def ops_of(plan: Plan, start: dict[str, State]) -> list[Op]:
    """The ops that make a view holding ``start`` (path: state) hold the merge, in the order they are written."""
    entries = []
    for one in plan.outcomes.values():
        merged, was = one.state, start[one.path]
        if merged is None or merged is was or merged == was:  # ``is`` first: the first input's own states
            continue
        # unequal files of one mode differ in their bytes: compared again only where the modes differ
        modified = merged.kind == "file" and (was.kind != "file" or was.mode == merged.mode
                                              or not was.same_bytes(merged))
        entries.append(changeset.Entry(one.path, view_side(was), view_side(merged), modified))
    order = {"delete": 0, "mkdir": 1, "write": 2, "symlink": 2, "chmod": 3}
    return sorted(changeset.promote_ops(entries), key=lambda op: (
        order[op.action], -op.path.count("/") if op.action == "delete" else op.path.count("/")))


def stacked_start(view: RootView, plan: Plan, first: str, donors: Sequence[str]) -> tuple[dict[str, State],
                                                                                        dict[str, int]]:
    """What a fork of ``first`` with ``donors``' layers stacked over it (top first, ForkRequest's)
    shows at each path of the plan (``view``: its root), and the mtimes of the files it shows as an
    input read them.

    A donor's layers decide a path where the donor's view differs there from the merge base's (the
    layers under them all): they hold it, or hide it.  Where it does not differ, they may still
    hold it (a file copied up with its bytes unchanged, ``Plan.unlisted``), hide it (below a path
    the donor names, which may be an opaque directory or a file), or not reach it at all: what shows
    is then the donor's state or what lies under it.  Where those candidates disagree and one
    differs from the merge, ``view`` itself is looked at (a file found there is rewritten whole), as
    where the base has a directory the merge has not (``_held_dir``).
    A directory is held, by every layer that holds something below it, with the mode its input saw
    then, which no change names: a merged directory whose mode differs from any input's or the
    base's gets its mode set again."""
    base, lower, sides = plan.base, plan.lower, plan.sides
    covers = {name: {path for path in plan.outcomes if sides[name][path] is not lower[path]} | plan.unlisted[name]
              for name in donors}
    heads = heads_of(plan.outcomes)
    above = {name: covers[name] & heads for name in donors}  # what a donor names that may hide a path below it
    start: dict[str, State] = {}
    kept: dict[str, int] = {}
    lost: set[str] = set()  # base directories the view shows no directory at: nothing of them below
    for path, outcome in plan.outcomes.items():
        merged, shown, source = outcome.state, [], first
        for name in donors:
            state = sides[name][path]
            if state is not base[path] and state != base[path]:  # its layers decide the path
                shown.append(state)
                source = name
                break
            if path in covers[name] or below_any(path, above[name]):
                shown.append(state)
                source = ""
        else:
            shown.append(sides[first][path])
        held = _held_dir(view, path, merged, base[path], lost)
        if held is not None:
            start[path], source = held, ""
        elif merged is None or all(one == merged for one in shown):
            start[path] = merged or shown[-1]
        elif all(one == shown[0] for one in shown):
            start[path] = shown[0]
        else:
            found, source = lstat(view, path), ""
            start[path] = ABSENT if found is None else State(found.kind, found.mode, None, found.target)
        if merged is not None and merged.kind == "dir" and start[path].kind == "dir" and any(
                one.kind == "dir" and one.mode != merged.mode for one in (lower[path], base[path], *(
                    sides[name][path] for name in (first, *donors)))):
            start[path] = State("dir", -1)  # a chmod, whatever the layers hold
        mtime = plan.mtimes.get(source, {}).get(path) if source else None
        if mtime is not None:
            kept[path] = mtime
    return start, kept


def _held_dir(view: RootView, path: str, merged: State | None, was: State, lost: set[str]) -> State | None:
    """The directory the view shows at ``path`` where the base has one and the merge has none: a donor's
    layer holds a copy of it (copied up for a change below it, or for one undone), which no change
    names and which shows over what the merge has there; None elsewhere.  ``lost``: the base's
    directories the view was found to show no directory at (nothing below them is looked at)."""
    if merged is None or merged.kind == "dir" or was.kind != "dir" or below_any(path, lost):
        return None
    found = lstat(view, path)
    if found is not None and found.kind == "dir":
        return State("dir", found.mode)
    lost.add(path)
    return None


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
_TRUNCATE = os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO planted there does not block it


class _Writer:
    """Files written through the capsule's parents (``DirFds``: each opened once), with the mtime each got.

    No one sees the capsule before its merge is written, so each file is written in place:
    created (``O_EXCL``) where ``start`` has no file, and where it has one opened with
    ``O_TRUNC``, for which overlayfs copies up the file's metadata and none of its bytes (a
    200 MB lower file opened so took 0.05 ms and left an empty file in the upper layer, kernel
    6.18); the file keeps its owner and extended attributes, as the fork showed them.  A
    temporary file renamed over it, as this wrote before, costs the writers the same CPU time
    (64 ms for the 1,000 files of bench/parts/merge.py) but waits longer: 50 ms against 45
    (medians of 60 interleaved merges each, faster in 42 of the 60 pairs; 16 pairs once gave
    55 against 37).  What the open found is written only if it is a regular file: the
    workspace under the fork may have moved since the merge read it.  The mode is given at
    creation and set again where it differs (the umask took bits, a truncated file kept its
    own, or it has set-id bits); the mtime is read from the open file after the write (a chmod
    leaves it)."""

    def __init__(self, dirs: DirFds) -> None:
        self.dirs = dirs
        self.mtimes: dict[str, int] = {}

    def put(self, path: str, data: bytes, mode: int, truncate: bool) -> None:
        head, _, name = path.rpartition("/")
        fd = open_name(self.dirs.get(head, "write"), name, _TRUNCATE if truncate else _CREATE, mode & 0o777)
        try:
            if truncate and not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CcwError("CONFLICT", f"{path} is no longer a regular file in the capsule's base (the "
                               "workspace changed while it was merged): nothing was made; merge again",
                               {"path": path})
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            st = os.fstat(fd)
            if st.st_mode & 0o7777 != mode:
                os.fchmod(fd, mode)
            self.mtimes[path] = st.st_mtime_ns
        finally:
            os.close(fd)


def _apply(view: RootView, ops: list[Op], contents: dict[str, State], start: dict[str, State]) -> dict[str, int]:
    """The ops, in order, none fsynced (see the module's docstring); the mtime of each file written.
    The files and symlinks, which no other op of theirs orders (their directories are made before
    them, their modes set after), are written ``WRITERS`` at a time, each writer with descriptors of
    its own: each file is an open and a write on overlayfs, syscalls that overlap on two cores."""
    first = next((i for i, op in enumerate(ops) if op.action not in ("delete", "mkdir")), len(ops))
    last = next((i for i, op in enumerate(ops) if op.action == "chmod"), len(ops))
    with DirFds(view) as dirs:
        for op in ops[:first]:
            _structure(view, dirs, op, contents[op.path])
    files = ops[first:last]
    share = -(-len(files) // WRITERS)
    with ThreadPoolExecutor(WRITERS) as pool:
        parts = list(pool.map(lambda part: _write(view, part, contents, start), [
            files[at:at + share] for at in range(0, len(files), share or 1)]))
    for op in ops[last:]:
        view.chmod(op.path, contents[op.path].mode)
    return {path: mtime for part in parts for path, mtime in part.items()}


def _held(view: RootView, paths: list[str], kept: dict[str, int]) -> dict[str, int]:
    """The mtimes of files the view already holds as merged: from ``kept`` where known, else stat'ed."""
    mtimes: dict[str, int] = {}
    with DirFds(view) as dirs:
        for path in paths:
            known = kept.get(path)
            if known is None:
                head, _, name = path.rpartition("/")
                known = os.stat(name, dir_fd=dirs.get(head), follow_symlinks=False).st_mtime_ns
            mtimes[path] = known
    return mtimes


def _structure(view: RootView, dirs: DirFds, op: Op, merged: State) -> None:
    """A delete or a mkdir (``dirs`` forgotten first: a directory removed or made must not be
    reached through a kept descriptor)."""
    dirs.forget()
    if op.action == "mkdir":
        view.makedirs(op.path)
        view.chmod(op.path, merged.mode)
    else:  # a directory whole: a donor's copy of it may hold what no change of the merge names
        remove_tree(view, op.path)


def _write(view: RootView, ops: list[Op], contents: dict[str, State], start: dict[str, State]) -> dict[str, int]:
    """Files and symlinks, through descriptors of this writer's own; the files' mtimes."""
    with DirFds(view) as dirs:
        writer = _Writer(dirs)
        for op in ops:
            merged = contents[op.path]
            if op.action == "symlink":
                make_symlink(view, merged.target or "", op.path)
                continue
            assert merged.data is not None
            try:  # not ``wrap_oserror``: its generator-based context costs tens of microseconds a file
                writer.put(op.path, merged.data, merged.mode, start[op.path].kind == "file")
            except OSError as exc:
                raise from_oserror(exc, "merge: write", op.path) from exc
        return writer.mtimes


Row = tuple[Any, ...]  # (path, action, bytes, target, mode, mtime_ns[, source]): Journal.add_merge's
KEEP = ".ccw-merge-dir"  # journaled written then deleted, so that a replay makes an empty directory


def _rows(paths: list[str], contents: dict[str, State], base: dict[str, State], mtimes: dict[str, int],
          sources: dict[str, str], replaced: set[str]) -> list[Row]:
    """The journal's rows for the written paths, in path order, then each directory's mode; a file's
    bytes where it has an mtime (``mtimes``: the files whose bytes are not the base's), else its mode.
    A file whose bytes the merge left unread (merge_plan.read_side's ``lazy``) names instead the
    input whose view holds them (``sources``): frozen while the merged capsule lives, it gives a
    witness of it the same bytes (``Journal.add_merge``).

    The journal has no row for a directory (a file tool makes none), and a replay makes a
    file's parents as it writes it, with mode 755: so a directory the merge made is
    journaled by what a replay can redo, a chmod after every write (it may be 700), a
    delete first where it replaces something else, and, where nothing journaled lies
    beneath it, a file written in it and deleted; a file or symlink replacing a directory
    is journaled deleted first too, and nothing below a directory deleted whole is journaled
    deleted again (the path would reach through the symlink now there)."""
    rows: list[Row] = []
    modes: list[Row] = []
    gone: set[str] = set()  # directories of the base journaled deleted whole
    held = {path.rpartition("/")[0] for path in paths if contents[path].kind not in (None, "dir")}
    held |= {head[:i] for head in held for i, char in enumerate(head) if char == "/"}
    for path in paths:
        merged, was = contents[path], base[path].kind
        if path in replaced:  # deleted first, so that a replay makes it anew: replaced, as the capsule shows it
            rows.append((path, "delete", None, None, None, None))
        if path in replaced or below_any(path, replaced):
            was = None  # nothing of the base is left here once its replaced directory is deleted
        if merged.kind is None and below_any(path, gone):
            continue  # deleted with its directory, which the replay may have made a link since: not through it
        if merged.kind is None or (was == "dir" and merged.kind != "dir"):
            rows.append((path, "delete", None, None, None, None))
            if was == "dir":
                gone.add(path)
        if merged.kind == "symlink":
            rows.append((path, "symlink", None, merged.target, None, None))
        elif merged.kind == "file" and path in mtimes:
            rows.append((path, "write", merged.data, None, merged.mode, mtimes[path], sources.get(path)))
        elif merged.kind == "file":
            rows.append((path, "chmod", None, None, merged.mode, None))  # only its mode changed
        elif merged.kind == "dir":
            if was not in (None, "dir"):
                rows.append((path, "delete", None, None, None, None))
            if was != "dir" and path not in held:
                rows += [(f"{path}/{KEEP}", "write", b"", None, 0o600, None),
                         (f"{path}/{KEEP}", "delete", None, None, None, None)]
            modes.append((path, "chmod", None, None, merged.mode, None))
    return rows + modes


def _journal(state: Any, capsule_id: str, paths: list[str], plan: Plan, contents: dict[str, State],
             mtimes: dict[str, int], recorded: dict[str, str], inputs: Sequence[str], sources: dict[str, str],
             replaced: set[str]) -> None:
    """Journal the written paths as file tools' changes (capsules/notes.py's ``note_tool_changes``), with
    each file's mtime, in one transaction with the base states the inputs recorded (``recorded``: the
    first record wins), as one batch of each (``Journal.add_merge``); and then the base's state where
    none is recorded yet."""
    journal = Journal(state)
    journal.add_merge(capsule_id, _rows(paths, contents, plan.base, mtimes, sources, replaced),
                      {key: state for key, state in recorded.items() if changeset.keyed_path(key) in contents}, inputs)
    unrecorded = [path for path in paths if contents[path].kind != "dir" and path not in recorded]
    record = journal.capsule(capsule_id) if unrecorded else None
    if record is not None:
        record_base_states(journal, record, unrecorded)


def write(state: Any, capsule_id: str, root_fd: int, plan: Plan, recorded: dict[str, str],
          start: dict[str, State] | tuple[str, Sequence[str]], kept: dict[str, int] | None = None,
          inputs: Sequence[str] = (), shown: Sequence[str] = ()) -> list[str]:
    """Write the merge into the capsule, whose view holds ``start`` (its root is closed after), and
    journal every path the merge changes against the base; those paths.  ``start`` may instead name
    the input it was forked from and the donors stacked over it (``stacked_start`` works out what
    it holds).  ``kept``: the mtimes of files the view holds as ``start`` does, where known
    (``Plan.mtimes`` of the input it was forked from: the fork shows that input's files themselves,
    so they need no stat here).  ``inputs``: the capsules merged, journaled as the new one's
    (``Journal.merged_from``: its promotion judges their runs).  ``shown``: the capsules whose
    layers it lies on (``_replaced`` says why)."""
    contents = {one.path: one.state for one in plan.outcomes.values() if one.state is not None}
    changed = sorted(one.path for one in plan.changed)  # each the path of an op from the base (promote_ops)
    sources = {one.path: one.sides[0] for one in plan.changed if one.state is not None and unread(one.state)}
    replaced, below = _replaced(plan, contents, shown, sources)
    dated = sorted({path for path in changed if contents[path].kind == "file"
                    and not contents[path].same_bytes(plan.base[path])}  # below a replaced directory: every file
                   | {path for path in below if contents[path].kind == "file"})
    with RootView.from_fd(root_fd) as view:
        if isinstance(start, tuple):
            start, kept = stacked_start(view, plan, *start)
        mtimes = _apply(view, ops_of(plan, start), contents, start)
        mtimes.update(_held(view, [path for path in dated if path not in mtimes], kept or {}))
    journaled = sorted({*changed, *replaced, *below})
    _journal(state, capsule_id, journaled, plan, contents, {path: mtimes[path] for path in dated}, recorded,
             inputs, sources, replaced)
    return changed


def _replaced(plan: Plan, contents: dict[str, State], shown: Sequence[str],
              sources: dict[str, str]) -> tuple[set[str], set[str]]:
    """The directories the capsule shows replaced (opaque: its layers show nothing of the base below
    them), and every path below them it shows.

    An input that replaced a directory (``rm -rf d; mkdir d``) lists it so (``Plan.opaque``), and
    the capsule lying on its layers (``shown``) shows it so too, so its change list names it; a
    replay, which redoes the journal from the base, makes it so only by deleting the directory
    first and writing back everything below it, the files the base held too.  Those files are
    journaled from the input that lists them (``sources``, ``contents`` updated to its state)."""
    replaced = {path for name in shown for path in plan.opaque.get(name, ())
                if contents.get(path) is not None and contents[path].kind == "dir"}
    if not replaced:
        return replaced, set()
    below = {path for path in contents if contents[path].kind is not None and below_any(path, replaced)}
    changed = {one.path for one in plan.changed}
    for path in sorted(below - changed):
        for name in shown if contents[path].kind == "file" else ():
            side = plan.sides.get(name, plan.base)[path]
            if side is not plan.lower[path] and side.kind == "file":
                contents[path] = side
                if unread(side):
                    sources[path] = name
                break
    return replaced, below
