"""The three-way merge of one path, as git merges it: pure, no capsule or helper involved.

Each side (the base and every capsule) has, at a path, a ``State``: absent, a directory,
a regular file (mode and bytes), a symlink (target) or something else.  The rules are
git's (merge-ort), and each outcome says which applied (``Outcome.how``):

- A side that left the path as the base had it changed nothing there.  When no side
  changed it the base stays; when every side that changed it made the same state, that
  state wins ("same change").
- When two sides made different states, only two regular files merge: their bytes
  through ``git merge-file`` against the base's (an empty base where the base held no
  regular file, as when both added the file or both replaced a directory or a symlink
  with one: git's add/add), their executable bits three-way (one side's change wins;
  both changed it differently is a conflict).  Bytes git calls binary (a NUL in the
  first 8,000) never merge.  A directory is no entry to git: a side that put one where
  the base had a file or a symlink (or put either where the base had a directory) took
  away the base's entry, as a side that deleted it did, so the two agree.  Everything
  else conflicts, named plainly: deleted on one side and changed on the other, a
  symlink retargeted twice, a file against a directory or a symlink.  A rename is a
  delete plus an add, so it merges as those two paths do.

Why ``git merge-file`` rather than a diff3 written here: a clean merge must give the
bytes git gives, and git's line matcher (xdiff, Myers with its own heuristics, adjacent
changes counted as overlapping, identical changes on both sides folded) decides which
lines a hunk covers; another matcher (difflib's) aligns repeated lines differently and
would merge or refuse other hunks.  It runs only for files both sides changed as text
(a path one side changed costs no process), with hooks and config out of reach
(``git_env``, no repository), and its conflict hunks are read back from its diff3
markers, made long enough (``MARKER``) that a file's own lines cannot pass for them.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass, field

from mcp_server.core.unidiff import is_binary
from mcp_server.fs.fingerprint import git_env
from mcp_server.fs.statcache import digest_of
from sandbox.errors import CcwError

MARKER = 41  # conflict marker length: "<" * 41 is no line a file holds by chance
TIMEOUT_S = 60


@dataclass(frozen=True, eq=False)
class State:
    """One path on one side; ``kind`` None: absent.

    A file holds its bytes, or only their digest where they were not read (a merge base's
    file that at most one side changed: fs/statcache.py); two states are equal when
    their kind, mode, target and bytes are, compared by digest where one side has no bytes."""

    kind: str | None  # file | dir | symlink | other | None
    mode: int = 0  # permission bits
    data: bytes | None = None  # a file's bytes (None with ``known_digest``: not read)
    target: str | None = None  # a symlink's target
    known_digest: str | None = None  # a file's blake3 (statcache.digest_of), when known without its bytes

    @property
    def digest(self) -> str | None:
        """A file's blake3 (hex), from its bytes unless it came with one (hashed once: a state's bytes
        are compared with the base's at every step of a merge)."""
        if self.known_digest is not None or self.data is None:
            return self.known_digest
        hashed: str | None = self.__dict__.get("_hashed")
        if hashed is None:
            hashed = digest_of(self.data)
            object.__setattr__(self, "_hashed", hashed)  # frozen: the cache is set past the dataclass's guard
        return hashed

    def same_bytes(self, other: State) -> bool:
        """Whether both hold the same bytes (compared directly where both were read); never where one's
        are not known (a file a merge left unread, merge_plan's ``unread``, or no file at all)."""
        if self.data is not None and other.data is not None:
            return self.data == other.data
        digest = self.digest
        return digest is not None and digest == other.digest

    def __eq__(self, other: object) -> bool:
        if self is other:  # a side that did not name a path holds the base's own state there
            return True
        if not isinstance(other, State):
            return NotImplemented
        if self.kind != other.kind or self.mode != other.mode or self.target != other.target:
            return False
        return self.kind != "file" or self.same_bytes(other)

    def __hash__(self) -> int:
        return hash((self.kind, self.mode, self.target, self.digest if self.kind == "file" else None))

    def describe(self) -> str:
        """How a report names it."""
        if self.kind is None:
            return "absent"
        if self.kind == "symlink":
            return f"symlink -> {self.target}"
        if self.kind == "file":
            return f"file {self.mode:o}" + (" (binary)" if is_binary(self.data) else "")
        return f"{self.kind} {self.mode:o}"


ABSENT = State(None)


@dataclass(frozen=True)
class Hunk:
    """One overlapping change: the base's lines and each side's; ``line``: where the base's lines
    start in the base file (1-based; where both sides added lines at one place, the base line
    they were added before; 0 when the file itself was added on both sides)."""

    line: int
    base: str
    ours: str
    theirs: str


@dataclass
class Outcome:
    """What the merge of one path gives: the state (None on a conflict), how, and the conflict's hunks."""

    path: str
    state: State | None
    how: str
    sides: tuple[str, ...] = ()  # the capsules whose change it is (a conflict: the two that clash)
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def conflict(self) -> bool:
        """Whether the path could not be merged."""
        return self.state is None


def _kind_word(state: State) -> str:
    return "deleted" if state.kind is None else {"dir": "a directory", "symlink": "a symlink",
                                                  "file": "a file"}.get(state.kind, "a special file")


def merge_path(path: str, base: State, sides: list[tuple[str, State]]) -> Outcome:
    """Merge one path's sides (name, state) against the base, as the module's docstring says."""
    # ``is`` first: a side that did not name the path holds the base's own state (merge_plan)
    changed = [(name, state) for name, state in sides if state is not base and state != base]
    if not changed:
        return Outcome(path, base, "unchanged")
    if len(changed) == 1:  # a merge of 2,000 paths is mostly this
        return Outcome(path, changed[0][1], "one side", (changed[0][0],))
    names = tuple(name for name, _ in changed)
    if all(state == changed[0][1] for _, state in changed):
        return Outcome(path, changed[0][1], "same change" if len(changed) > 1 else "one side", names)
    acc_names, acc = [changed[0][0]], changed[0][1]
    hows: list[str] = []
    for name, state in changed[1:]:
        if state == acc:
            acc_names.append(name)
            continue
        one = merge_two(path, base, acc, state)
        if one.conflict:
            one.sides = ("+".join(acc_names), name)
            return one
        assert one.state is not None
        acc, hows = one.state, [*hows, one.how]
        acc_names.append(name)
    return Outcome(path, acc, "; ".join(dict.fromkeys(hows)) or "same change", names)


def merge_two(path: str, base: State, ours: State, theirs: State) -> Outcome:
    """Two different changes of one path against the base."""
    if ours.kind == "file" and theirs.kind == "file":
        return _merge_files(path, base, ours, theirs)
    if ours.kind is None or theirs.kind is None:
        kept = theirs if ours.kind is None else ours
        if "dir" in (base.kind, kept.kind) and base.kind != kept.kind:
            # git holds no directory as an entry: a side that replaced the base's entry with a directory
            # (or its directory with an entry) deleted what the base had there, as the other side did,
            # and what is left below is merged path by path
            return Outcome(path, kept, f"deleted on one side, replaced by {_kind_word(kept)} on the other")
        how = f"conflict: deleted on one side, changed on the other (now {_kind_word(kept)})"
    elif ours.kind == theirs.kind == "symlink":
        how = f"conflict: symlink changed on both sides ({ours.target!r} and {theirs.target!r})"
    elif ours.kind == theirs.kind == "dir":
        how = "conflict: directory mode changed on both sides"
    elif base.kind is None:
        how = f"conflict: added on both sides, as {_kind_word(ours)} and {_kind_word(theirs)}"
    elif ours.kind == theirs.kind:
        how = f"conflict: {_kind_word(base)} replaced on both sides, by different {ours.kind}s"
    else:
        how = f"conflict: {_kind_word(ours)} on one side, {_kind_word(theirs)} on the other"
    return Outcome(path, None, how)


def _merge_files(path: str, base: State, ours: State, theirs: State) -> Outcome:
    # over no regular file, git merges two files as added (merge-ort's two-way merge: an empty base, no base mode)
    added = "added on both sides" + ("" if base.kind in ("file", None) else f" in place of {_kind_word(base)}")
    if base.kind != "file" and ours.mode != theirs.mode:
        return Outcome(path, None, f"conflict: {added} with different modes ({ours.mode:o} and {theirs.mode:o})")
    if base.mode == ours.mode or ours.mode == theirs.mode:
        mode = theirs.mode
    elif base.mode == theirs.mode:
        mode = ours.mode
    else:
        return Outcome(path, None, f"conflict: mode changed on both sides ({ours.mode:o} and {theirs.mode:o})")
    if base.kind == "file" and base.data is None:  # merge_plan reads the base wherever two sides changed a path
        raise CcwError("INTERNAL", f"merge of {path}: the base's bytes were not read; merge again")
    old, one, two = (base.data or b"") if base.kind == "file" else b"", ours.data or b"", theirs.data or b""
    if one == two:
        return Outcome(path, State("file", mode, one), "mode merged")
    if base.kind == "file" and (one == old or two == old):  # an added empty file is no base's bytes: git merges it
        return Outcome(path, State("file", mode, two if one == old else one), "content from one side, mode merged")
    if any(is_binary(data) for data in (old, one, two)):
        return Outcome(path, None, "conflict: binary file changed on both sides (git merges no binary content)")
    merged, clean = merge_file(old, one, two)
    if not clean:
        what = added if base.kind != "file" else "changed on both sides"
        return Outcome(path, None, f"conflict: overlapping lines {what}", hunks=conflict_hunks(merged, old, one, two))
    return Outcome(path, State("file", mode, merged), "lines merged" + (f" ({added})" if base.kind != "file" else ""))


def merge_file(base: bytes, ours: bytes, theirs: bytes) -> tuple[bytes, bool]:
    """``git merge-file -p --diff3`` of three texts: the result (with markers on a conflict) and whether it is clean."""
    with tempfile.TemporaryDirectory(prefix="ccw-merge-") as scratch:
        names = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            with open(os.path.join(scratch, name), "wb") as file:
                file.write(data)
            names.append(os.path.join(scratch, name))
        argv = ["git", "merge-file", "-p", "--diff3", f"--marker-size={MARKER}", "-L", "ours", "-L", "base",
                "-L", "theirs", *names]
        try:
            done = subprocess.run(argv, capture_output=True, env=git_env({"GIT_CONFIG_NOSYSTEM": "1",
                                                                           "GIT_CONFIG_GLOBAL": "/dev/null"}),
                                  cwd=scratch, timeout=TIMEOUT_S, check=False)
        except FileNotFoundError as exc:
            raise CcwError("UNSUPPORTED", "git is not installed on the host: files changed on both sides cannot be "
                           "merged; install git, or merge capsules that change different files") from exc
    if done.returncode < 0 or done.returncode > 127:
        raise CcwError("INTERNAL", f"git merge-file failed: {done.stderr.decode(errors='replace').strip()[-500:]}")
    return done.stdout, done.returncode == 0


def _changed(base: bytes, side: bytes) -> list[tuple[int, int]]:
    """Where ``side`` changed ``base``: each change's base lines as (first, count), 1-based, a count
    of 0 meaning lines added before ``first``; as ``git diff`` aligns them (the matcher git's merge
    uses, so the conflicts' base ranges are unions of these)."""
    with tempfile.TemporaryDirectory(prefix="ccw-merge-") as scratch:
        for name, data in (("base", base), ("side", side)):
            with open(os.path.join(scratch, name), "wb") as file:
                file.write(data)
        done = subprocess.run(["git", "diff", "--no-index", "--no-color", "--no-ext-diff", "-U0", "base", "side"],
                              capture_output=True, env=git_env({"GIT_CONFIG_NOSYSTEM": "1",
                                                                "GIT_CONFIG_GLOBAL": "/dev/null"}),
                              cwd=scratch, timeout=TIMEOUT_S, check=False)
    ranges = []
    for line in done.stdout.splitlines():
        if line.startswith(b"@@ -"):
            first, _, count = line[4:].split(b" ", 1)[0].partition(b",")
            lines = int(count) if count else 1
            ranges.append((int(first) + (lines == 0), lines))  # "-N,0": added after line N
    return ranges


def _base_line(base_lines: list[bytes], old: list[bytes], after: int, ours: list[tuple[int, int]],
               theirs: list[tuple[int, int]]) -> int:
    """The base line (1-based) where a conflict's base lines ``old`` start, at or after ``after``:
    the first change's start there that holds those lines and that both sides' changes touch
    (a conflict is one); 0 where none does."""
    def touched(changes: list[tuple[int, int]], first: int, end: int) -> bool:
        return any(start <= end and first <= start + count for start, count in changes)
    for first in sorted({start for start, _ in ours + theirs}):
        end = first + len(old)
        if first >= after and base_lines[first - 1:end - 1] == old \
                and touched(ours, first, end) and touched(theirs, first, end):
            return first
    return 0


def conflict_hunks(merged: bytes, base: bytes, ours: bytes, theirs: bytes) -> list[Hunk]:
    """The conflicts of a ``merge_file`` result, read back from its diff3 markers, each placed in
    the base by where the two sides changed it (``_changed``): the same lines may stand in the
    base more than once, and a text search would name the first."""
    marks = {b"<" * MARKER: "ours", b"|" * MARKER: "base", b"=" * MARKER: "theirs", b">" * MARKER: "end"}
    hunks: list[Hunk] = []
    part: str | None = None
    parts: dict[str, list[bytes]] = {}
    base_lines = base.splitlines(keepends=True)
    changes = (_changed(base, ours), _changed(base, theirs)) if base else ([], [])
    after = 1  # hunks come in base order: each is looked for after the one before
    for line in merged.splitlines(keepends=True):
        mark = marks.get(line.split(b" ", 1)[0].rstrip(b"\r\n"))
        if mark == "ours" and part is None:
            part, parts = "ours", {"ours": [], "base": [], "theirs": []}
        elif mark in ("base", "theirs") and part is not None:
            part = mark
        elif mark == "end" and part is not None:
            at = _base_line(base_lines, parts["base"], after, *changes) if base else 0
            after = at + len(parts["base"]) if at else after
            texts = (b"".join(parts[k]).decode("utf-8", "replace") for k in ("base", "ours", "theirs"))
            hunks.append(Hunk(at, *texts))
            part = None
        elif part is not None:
            parts[part].append(line)
    return hunks
