"""Render changes as a git-style unified diff that ``git apply`` accepts.

One renderer for every diff ccw shows (capsule_diff, deltamin's minimal patch): text
hunks with three lines of context and ``\\ No newline at end of file`` markers, new and
deleted files, mode changes, symlinks (mode 120000, the target as content) and binary
files as ``GIT binary patch`` literals with full ``index`` lines, which is what git needs
to apply a binary change.  Input is a list of ``FileChange`` with old and new content;
output is bytes, because patched files need not be UTF-8.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import zlib
from dataclasses import dataclass

CONTEXT = 3
_BINARY_SNIFF = 8000  # git's heuristic: a NUL in the first 8000 bytes means binary


@dataclass(frozen=True)
class FileChange:
    """One path's before and after; ``None`` content means the file did not exist."""

    path: str
    old: bytes | None
    new: bytes | None
    old_mode: int | None = None  # 0o100644, 0o100755 or 0o120000 (symlink), git style
    new_mode: int | None = None
    binary: bool | None = None  # force the binary form (e.g. text that is not UTF-8); None: sniff


def is_binary(data: bytes | None) -> bool:
    """git's test: a NUL byte near the start."""
    return data is not None and b"\0" in data[:_BINARY_SNIFF]


def git_blob_id(data: bytes) -> str:
    """The sha1 git gives a blob with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _quote(path: str) -> bytes:
    # git quotes paths with special characters C-style; we write them the way git reads.
    raw = path.encode("utf-8", "surrogateescape")
    if all(32 < b < 127 and b not in (34, 92) for b in raw):
        return raw
    out = bytearray(b'"')
    for b in raw:
        if b in (34, 92):
            out += b"\\" + bytes([b])
        elif b == 9:
            out += b"\\t"
        elif b == 10:
            out += b"\\n"
        elif 32 <= b < 127:
            out.append(b)
        else:
            out += b"\\%03o" % b
    out += b'"'
    return bytes(out)


def split_lines(data: bytes) -> list[bytes]:
    """Lines as git sees them: split on LF only, each keeping its LF (the last may lack one).

    Not ``bytes.splitlines``, which also splits on a lone CR: a line ``a\rb`` would be
    shown as two lines, and the diff would no longer apply to the file it came from.
    """
    lines = data.split(b"\n")
    out = [line + b"\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _hunks(old: bytes, new: bytes) -> list[bytes]:
    a = split_lines(old)
    b = split_lines(new)
    out: list[bytes] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(CONTEXT):
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        out.append(b"@@ -%s +%s @@\n" % (_range(i1, i2), _range(j1, j2)))
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out.extend(_lines(b" ", a[x1:x2]))
                continue
            out.extend(_lines(b"-", a[x1:x2]))
            out.extend(_lines(b"+", b[y1:y2]))
    return out


def _range(start: int, stop: int) -> bytes:
    length = stop - start
    first = start + 1 if length else start
    return b"%d" % first if length == 1 else b"%d,%d" % (first, length)


def _lines(prefix: bytes, lines: list[bytes]) -> list[bytes]:
    out = []
    for line in lines:
        if line.endswith(b"\n"):
            out.append(prefix + line)
        else:
            out.append(prefix + line + b"\n\\ No newline at end of file\n")
    return out


def _base85_block(data: bytes) -> list[bytes]:
    """git's base85 framing: per line a length char (A-Z = 1..26, a-z = 27..52), then data."""
    deflated = zlib.compress(data, 9)
    lines = []
    for i in range(0, len(deflated), 52):
        chunk = deflated[i : i + 52]
        n = len(chunk)
        length_char = bytes([ord("A") + n - 1]) if n <= 26 else bytes([ord("a") + n - 27])
        lines.append(length_char + base64.b85encode(chunk, pad=True) + b"\n")
    return lines


def _binary_patch(old: bytes, new: bytes) -> list[bytes]:
    out = [b"GIT binary patch\n", b"literal %d\n" % len(new), *_base85_block(new), b"\n"]
    out += [b"literal %d\n" % len(old), *_base85_block(old), b"\n"]
    return out


def render(change: FileChange) -> bytes:
    """The diff of one file, or b"" when nothing differs."""
    old, new = change.old, change.new
    if old == new and change.old_mode == change.new_mode:
        return b""
    q = _quote(change.path)
    a_path = b"a/" + q if not q.startswith(b'"') else b'"a/' + q[1:]
    b_path = b"b/" + q if not q.startswith(b'"') else b'"b/' + q[1:]
    out = [b"diff --git %s %s\n" % (a_path, b_path)]
    old_mode = change.old_mode or 0o100644
    new_mode = change.new_mode or 0o100644
    if old is None:
        out.append(b"new file mode %o\n" % new_mode)
    elif new is None:
        out.append(b"deleted file mode %o\n" % old_mode)
    elif old_mode != new_mode:
        out.append(b"old mode %o\nnew mode %o\n" % (old_mode, new_mode))
    old_bytes = old if old is not None else b""
    new_bytes = new if new is not None else b""
    if old_bytes == new_bytes and old is not None and new is not None:
        return b"".join(out)  # a mode change only
    binary = change.binary if change.binary is not None else (is_binary(old) or is_binary(new))
    if binary:
        zero = "0" * 40
        old_id = git_blob_id(old_bytes) if old is not None else zero
        new_id = git_blob_id(new_bytes) if new is not None else zero
        mode_suffix = b" %o" % new_mode if old is not None and new is not None and old_mode == new_mode else b""
        out.append(b"index %s..%s%s\n" % (old_id.encode(), new_id.encode(), mode_suffix))
        out += _binary_patch(old_bytes, new_bytes)
        return b"".join(out)
    out.append((b"--- %s\n" % a_path) if old is not None else b"--- /dev/null\n")
    out.append((b"+++ %s\n" % b_path) if new is not None else b"+++ /dev/null\n")
    out += _hunks(old_bytes, new_bytes)
    return b"".join(out)


def render_all(changes: list[FileChange]) -> bytes:
    """Every file's diff, in path byte order."""
    ordered = sorted(changes, key=lambda c: c.path.encode("utf-8", "surrogateescape"))
    return b"".join(render(c) for c in ordered)


def numstat(change: FileChange) -> tuple[int | None, int | None]:
    """(lines added, lines removed), or (None, None) for binary files, as git --numstat."""
    if change.binary or is_binary(change.old) or is_binary(change.new):
        return None, None
    a = split_lines(change.old or b"")
    b = split_lines(change.new or b"")
    added = removed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            removed += i2 - i1
        if tag in ("replace", "insert"):
            added += j2 - j1
    return added, removed


def hunk_count(patch: str) -> int:
    """The hunks a rendered diff holds (its ``@@ `` lines)."""
    return sum(1 for line in patch.splitlines() if line.startswith("@@ "))
