"""Applying unified-diff patches strictly, deciding as ``git apply`` does.

Some facts about how ``git apply`` places a hunk (apply.c, default options), which this
module reproduces so that the same patch is accepted or refused the same way:

- Matching is byte for byte on whole lines, newline included: no whitespace
  normalisation and no fuzz (``-C`` is unlimited by default, so context is never
  reduced).  A line ending in CR LF is just a line whose content ends in CR.
- The search starts at the hunk's *new* start line minus one (earlier hunks have
  already moved the text) and alternates forward, backward, forward, … one line at a
  time until the preimage matches exactly.  The first match wins.
- A hunk whose old start is 0 or 1 must match at the beginning of the file; a hunk
  with no trailing context must match at its end.
- Lines produced by an earlier hunk are marked patched and can never be matched by a
  later one, so hunks cannot overlap.
- A new file must not exist; a deleted file must exist and the deletion must leave
  nothing; a path removed or renamed away by an earlier file diff cannot be patched.
  Mode bits follow the patch (``new mode``, ``index … <mode>``), else the old file's.
- Binary ``literal`` patches are applied when their full preimage id names the current
  content; binary ``delta`` patches and symlinks are refused as unsupported rejects
  rather than guessed at.

A refused hunk is reported, and the remaining hunks are still tried so that every
problem is reported at once; nothing is written by this module: ``apply`` returns the
new content of every touched path and the caller writes only when there are no rejects.
The patch itself is parsed by ``mcp_server/core/patch.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcp_server.core.patch import MODE_FILE, MODE_LINK, FilePatch, Hunk
from mcp_server.core.paths import path_key
from mcp_server.core.unidiff import git_blob_id, split_lines

_NULL_OID = "0" * 40


Reader = Callable[[str], "tuple[bytes, int] | None"]


@dataclass
class ApplyResult:
    """What applying a patch would do: new content per path (None: deleted) and rejects."""

    files: dict[str, tuple[bytes, int] | None]
    rejects: list[dict[str, Any]]
    touched: list[str]


def _find(image: list[bytes], patched: list[bool], hunk: Hunk, begin: bool, end: bool) -> int:
    pre = hunk.old
    nr = len(image)
    line = hunk.new_start - 1 if hunk.new_start else 0
    if begin:
        line = 0
    elif end:
        line = nr - len(pre)
    line = min(max(line, 0), nr) if line >= 0 else nr

    def matches(at: int) -> bool:
        if at + len(pre) > nr:
            return False
        if end and at + len(pre) != nr:
            return False
        if begin and at:
            return False
        return all(not patched[at + k] and image[at + k] == pre[k] for k in range(len(pre)))

    back = fwd = line
    at = line
    i = 0
    while True:
        if matches(at):
            return at
        while True:
            if back == 0 and fwd == nr:
                return -1
            if i & 1:
                if back == 0:
                    i += 1
                    continue
                back -= 1
                at = back
            else:
                if fwd == nr:
                    i += 1
                    continue
                fwd += 1
                at = fwd
            break
        i += 1


def apply_hunks(content: bytes, hunks: list[Hunk]) -> tuple[bytes, list[int]]:
    """Apply hunks in order; return the new content and the indices of hunks that failed."""
    image = split_lines(content)
    patched = [False] * len(image)
    failed = []
    for index, hunk in enumerate(hunks):
        begin = hunk.old_start == 0 or hunk.old_start == 1
        end = hunk.trailing == 0
        at = _find(image, patched, hunk, begin, end)
        if at < 0:
            failed.append(index)
            continue
        image[at:at + len(hunk.old)] = hunk.new
        patched[at:at + len(hunk.old)] = [True] * len(hunk.new)
    return b"".join(image), failed


class _Applier:
    """One ``apply``: the tree as the patches so far left it, and the rejects."""

    def __init__(self, read: Reader) -> None:
        self.read = read
        self.state: dict[str, tuple[bytes, int] | None] = {}
        self.gone: set[str] = set()  # removed or renamed away by an earlier file diff
        self.rejects: dict[str, list[dict[str, Any]]] = {}
        self.touched: set[str] = set()

    def current(self, path: str) -> tuple[bytes, int] | None:
        """A path's content and mode as the earlier file diffs left it."""
        return self.state[path] if path in self.state else self.read(path)

    def reject(self, patch: FilePatch, index: int, reason: str) -> None:
        """Record a refused hunk (index 0 for a refusal of the whole file diff)."""
        self.rejects.setdefault(patch.path, []).append({"index": index, "reason": reason})

    def file(self, patch: FilePatch) -> None:
        """Apply one file diff over the current tree, or record why not."""
        self.touched.update(p for p in (patch.old_path, patch.new_path) if p)
        old = self.preimage(patch)
        if old is None:
            return
        content, mode = old
        if patch.old_mode is not None and (patch.old_mode & 0o170000) != (mode & 0o170000):
            self.reject(patch, 0, "wrong_type")
            return
        new_content = self.new_content(patch, content)
        if new_content is None:
            return
        if patch.is_delete:
            if new_content:
                self.reject(patch, len(patch.hunks) - 1 if patch.hunks else 0, "removal_leaves_content")
                return
            assert patch.old_path is not None
            self.remove(patch.old_path)
            return
        if patch.is_rename and patch.old_path and patch.old_path != patch.new_path:
            self.remove(patch.old_path)
        assert patch.new_path is not None
        self.state[patch.new_path] = (new_content, patch.new_mode if patch.new_mode is not None else mode)
        self.gone.discard(patch.new_path)

    def preimage(self, patch: FilePatch) -> tuple[bytes, int] | None:
        """The content and mode the file diff applies to, or None (rejected)."""
        if patch.binary_unsupported:
            self.reject(patch, 0, "binary_patch_unsupported")
            return None
        if MODE_LINK in (patch.old_mode, patch.new_mode):
            self.reject(patch, 0, "symlink_unsupported")
            return None
        if patch.is_new:
            assert patch.new_path is not None
            if self.current(patch.new_path) is not None:
                self.reject(patch, 0, "already_exists")
                return None
            return (b"", patch.new_mode or MODE_FILE)
        assert patch.old_path is not None
        if patch.old_path in self.gone and not (patch.is_rename or patch.is_copy):
            self.reject(patch, 0, "path_deleted_earlier")
            return None
        old = self.current(patch.old_path)
        if old is None:
            self.reject(patch, 0, "file_not_found")
            return None
        if (patch.is_rename or patch.is_copy) and patch.new_path != patch.old_path:
            assert patch.new_path is not None
            if self.current(patch.new_path) is not None and patch.new_path not in self.gone:
                self.reject(patch, 0, "already_exists")
                return None
        return old

    def new_content(self, patch: FilePatch, content: bytes) -> bytes | None:
        """The file's content after the diff, or None (a hunk or the preimage was rejected)."""
        if patch.binary is not None:
            # As git does: the full preimage id must name the current content.
            expected = patch.old_oid if not patch.is_new else _NULL_OID
            if len(expected) != 40 or (not patch.is_new and git_blob_id(content) != expected):
                self.reject(patch, 0, "binary_preimage_mismatch")
                return None
            return patch.binary
        new_content, failed = apply_hunks(content, patch.hunks)
        for index in failed:
            self.reject(patch, index, "context_mismatch")
        return None if failed else new_content

    def remove(self, path: str) -> None:
        """The path is gone after this file diff (deleted, or renamed away)."""
        self.state[path] = None
        self.gone.add(path)

    def result(self) -> ApplyResult:
        """Everything applied so far, rejects sorted by path, then hunk."""
        ordered: list[dict[str, Any]] = [
            {"path": p, "hunks": sorted(self.rejects[p], key=lambda h: (int(h["index"]), str(h["reason"])))}
            for p in sorted(self.rejects, key=path_key)
        ]
        return ApplyResult(self.state, ordered, sorted(self.touched, key=path_key))


def apply(patches: list[FilePatch], read: Reader) -> ApplyResult:
    """Apply file patches over a tree seen through ``read(path) -> (content, mode) | None``."""
    applier = _Applier(read)
    for patch in patches:
        applier.file(patch)
    return applier.result()
