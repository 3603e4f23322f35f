"""Unified-diff patches: the parser (applying them is ``mcp_server/core/patch_apply.py``).

Some facts about how ``git apply`` reads a patch (apply.c, default options), which this
module reproduces so that the same patch is understood the same way:

- ``\\ No newline at end of file`` removes the newline of the line before it, in the
  old side, the new side or both.  An empty line inside a hunk is an empty context line.
- Patches are parsed by the counts in the ``@@`` headers, so trailing text such as a
  ``format-patch`` signature is ignored; anything outside a file diff is ignored.
- Mode bits come from ``new mode`` / ``old mode`` and the ``index … <mode>`` line.
- Binary ``literal`` patches are decoded (at most ``MAX_LITERAL_BYTES``); binary
  ``delta`` patches are marked unsupported, for the applier to refuse.
"""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import dataclass, field

from mcp_server.core.paths import normalize
from mcp_server.core.unidiff import split_lines
from sandbox.errors import CcwError

MODE_FILE = 0o100644
MODE_EXEC = 0o100755
MODE_LINK = 0o120000

# The largest binary literal a patch may carry.  zlib compresses zeros about 1000:1, so
# without a cap a 1 MiB patch could make the front end build a gigabyte in memory.
MAX_LITERAL_BYTES = 64 << 20
_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class Hunk:
    """One ``@@`` hunk: the lines it expects (old) and the lines it leaves (new)."""

    old_start: int
    new_start: int
    old: list[bytes] = field(default_factory=list)
    new: list[bytes] = field(default_factory=list)
    leading: int = 0
    trailing: int = 0


@dataclass
class FilePatch:
    """One file's diff."""

    old_path: str | None
    new_path: str | None
    old_mode: int | None = None
    new_mode: int | None = None
    is_new: bool = False
    is_delete: bool = False
    is_rename: bool = False
    is_copy: bool = False
    hunks: list[Hunk] = field(default_factory=list)
    binary: bytes | None = None  # literal new content of a binary patch
    old_oid: str = ""  # from the "index" line; binary patches need it in full
    binary_unsupported: bool = False

    @property
    def path(self) -> str:
        """The path a reject is reported under: the new name, or the old one for a deletion."""
        return self.new_path or self.old_path or ""


def _corrupt(lineno: int, why: str) -> CcwError:
    return CcwError(
        "INVALID_ARGUMENT",
        f"corrupt patch at line {lineno}: {why}; send a unified diff as `git diff` prints it",
        {"line": lineno},
    )


def _unquote(raw: bytes) -> bytes:
    """git's C-style quoted path (``"a/tab\\there"``) to bytes."""
    if not raw.startswith(b'"'):
        return raw
    out = bytearray()
    i = 1
    escapes = {b"n": 10, b"t": 9, b"a": 7, b"b": 8, b"f": 12, b"r": 13, b"v": 11, b'"': 34, b"\\": 92}
    while i < len(raw) and raw[i:i + 1] != b'"':
        ch = raw[i:i + 1]
        if ch == b"\\":
            nxt = raw[i + 1:i + 2]
            if nxt in escapes:
                out.append(escapes[nxt])
                i += 2
                continue
            if nxt.isdigit():
                digits = raw[i + 1:i + 4]
                if len(digits) != 3 or any(c not in b"01234567" for c in digits) or digits[0] > ord("3"):
                    raise ValueError(f"{digits!r} after a backslash is not a three-digit octal byte")
                out.append(int(digits, 8))
                i += 4
                continue
        out += ch
        i += 1
    return bytes(out)


def _name(raw: bytes, strip: int, lineno: int) -> str | None:
    """A path from a ``---``/``+++``/``rename`` line: unquoted, prefix stripped, normalised."""
    raw = raw.rstrip(b"\n")
    if not raw.startswith(b'"') and b"\t" in raw:
        raw = raw.split(b"\t", 1)[0]
    if raw == b"/dev/null":
        return None
    try:
        name = _unquote(raw)
    except ValueError as exc:
        raise _corrupt(lineno, str(exc)) from None
    for _ in range(strip):
        if b"/" not in name:
            raise _corrupt(lineno, f"path {name!r} has no prefix to strip")
        name = name.split(b"/", 1)[1]
    text = name.decode("utf-8", "surrogateescape")
    return normalize(text)


def _closing_quote(raw: bytes) -> int:
    """Index of the quote that ends the C-quoted name at the start of ``raw``, or -1."""
    i = 1
    while i < len(raw):
        if raw[i] == 0x5C:  # a backslash escapes the next byte, a quote or itself included
            i += 2
            continue
        if raw[i] == 0x22:
            return i
        i += 1
    return -1


def _git_header_names(rest: bytes, lineno: int) -> tuple[str | None, str | None]:
    rest = rest.rstrip(b"\n")
    if rest.startswith(b'"'):
        end = _closing_quote(rest)
        if end < 0:
            raise _corrupt(lineno, "a quoted path has no closing quote")
        first, second = rest[: end + 1], rest[end + 2:]
        return _name(first, 1, lineno), _name(second, 1, lineno)
    # "a/NAME b/NAME": the only split where both halves agree.
    n = (len(rest) - 5) // 2
    if len(rest) == 2 * n + 5 and rest[n + 2:n + 5] == b" b/" and rest[2:n + 2] == rest[n + 5:]:
        name = _name(rest[: n + 2], 1, lineno)
        return name, name
    return None, None


def parse_patch(data: bytes) -> list[FilePatch]:
    """Parse a unified diff (git's extended headers included) into file patches."""
    lines = split_lines(data)
    patches: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(b"diff --git "):
            i = _parse_git(lines, i, patches)
        elif (
            line.startswith(b"--- ")
            and i + 2 < len(lines)
            and lines[i + 1].startswith(b"+++ ")
            and lines[i + 2].startswith(b"@@ -")
        ):
            old = _name(line[4:], 1, i + 1) if line[4:].rstrip(b"\n") != b"/dev/null" else None
            new = _name(lines[i + 1][4:], 1, i + 2) if lines[i + 1][4:].rstrip(b"\n") != b"/dev/null" else None
            patch = FilePatch(old, new, is_new=old is None, is_delete=new is None)
            i = _parse_hunks(lines, i + 2, patch)
            patches.append(_named(patch, i))
        else:
            i += 1
    return patches


def _mode(raw: bytes, lineno: int) -> int:
    """A file mode from a git header line (octal digits)."""
    try:
        return int(raw, 8)
    except ValueError:
        raise _corrupt(lineno, f"{raw[:20]!r} is not an octal file mode") from None


def _parse_git(lines: list[bytes], i: int, patches: list[FilePatch]) -> int:
    old, new = _git_header_names(lines[i][len(b"diff --git "):], i + 1)
    patch = FilePatch(old, new)
    i += 1
    while i < len(lines):
        line = lines[i].rstrip(b"\n")
        if line.startswith(b"old mode "):
            patch.old_mode = _mode(line[9:], i + 1)
        elif line.startswith(b"new mode "):
            patch.new_mode = _mode(line[9:], i + 1)
        elif line.startswith(b"deleted file mode "):
            patch.is_delete, patch.old_mode = True, _mode(line[18:], i + 1)
        elif line.startswith(b"new file mode "):
            patch.is_new, patch.new_mode = True, _mode(line[14:], i + 1)
        elif line.startswith(b"index "):
            parts = line.split(b" ")
            patch.old_oid = parts[1].split(b"..")[0].decode("ascii", "replace")
            if len(parts) == 3:
                patch.old_mode = patch.new_mode = _mode(parts[2], i + 1)
        elif line.startswith((b"rename from ", b"copy from ")):
            patch.old_path = _name(line.split(b" ", 2)[2], 0, i + 1)
            patch.is_rename = line.startswith(b"rename")
            patch.is_copy = not patch.is_rename
        elif line.startswith((b"rename to ", b"copy to ")):
            patch.new_path = _name(line.split(b" ", 2)[2], 0, i + 1)
        elif line.startswith((b"similarity index ", b"dissimilarity index ")):
            pass
        elif line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            if line[4:] != b"/dev/null":
                patch.old_path = _name(line[4:], 1, i + 1)
            if lines[i + 1][4:].rstrip(b"\n") != b"/dev/null":
                patch.new_path = _name(lines[i + 1][4:], 1, i + 2)
            i = _parse_hunks(lines, i + 2, patch)
            break
        elif line == b"GIT binary patch":
            i = _parse_binary(lines, i + 1, patch)
            break
        elif line.startswith(b"Binary files "):
            patch.binary_unsupported = True
            i += 1
            break
        else:
            break
        i += 1
    if patch.is_new:
        patch.old_path = None
    if patch.is_delete:
        patch.new_path = None
    patches.append(_named(patch, i))
    return i


def _named(patch: FilePatch, lineno: int) -> FilePatch:
    """``patch`` if it names the paths apply() needs, else a corrupt-patch error."""
    # "--- /dev/null" and "+++ /dev/null" together read as both new and deleted.
    if patch.old_path is None and patch.new_path is None:
        raise _corrupt(lineno, "a file diff names no path")
    # A damaged header can leave one side unnamed; apply() needs both unless new or deleted.
    if (patch.old_path is None and not patch.is_new) or (patch.new_path is None and not patch.is_delete):
        raise _corrupt(lineno, "a file diff names only one side (old or new path) "
                               "and is neither a new nor a deleted file")
    # A rename or copy names both sides; git never pairs one with "new file" or "deleted file".
    if (patch.is_rename or patch.is_copy) and (patch.is_new or patch.is_delete):
        raise _corrupt(lineno, "a file diff is both a rename or copy and a new or deleted file")
    return patch


def _parse_hunks(lines: list[bytes], i: int, patch: FilePatch) -> int:
    while i < len(lines) and lines[i].startswith(b"@@ -"):
        match = _HUNK.match(lines[i])
        if not match:
            raise _corrupt(i + 1, "malformed @@ header")
        old_count = int(match[2]) if match[2] is not None else 1
        new_count = int(match[4]) if match[4] is not None else 1
        hunk = Hunk(int(match[1]), int(match[3]))
        i += 1
        changed = False
        last: list[list[bytes]] = []
        while old_count > 0 or new_count > 0:
            if i >= len(lines):
                raise _corrupt(i, "the patch ends inside a hunk")
            line = lines[i]
            first = line[:1]
            if first in (b" ", b"\n"):
                body = line[1:] if first == b" " else b"\n"
                hunk.old.append(body)
                hunk.new.append(body)
                old_count, new_count = old_count - 1, new_count - 1
                if not changed:
                    hunk.leading += 1
                hunk.trailing += 1
                last = [hunk.old, hunk.new]
            elif first == b"-":
                hunk.old.append(line[1:])
                old_count -= 1
                changed, hunk.trailing = True, 0
                last = [hunk.old]
            elif first == b"+":
                hunk.new.append(line[1:])
                new_count -= 1
                changed, hunk.trailing = True, 0
                last = [hunk.new]
            elif first == b"\\":
                _no_newline(last, i)
            else:
                raise _corrupt(i + 1, f"unexpected line in hunk: {line[:40]!r}")
            if old_count < 0 or new_count < 0:
                raise _corrupt(i + 1, "hunk longer than its header says")
            i += 1
        if i < len(lines) and lines[i].startswith(b"\\"):
            _no_newline(last, i)
            i += 1
        patch.hunks.append(hunk)
    return i


def _no_newline(last: list[list[bytes]], i: int) -> None:
    if not last:
        raise _corrupt(i + 1, "'\\ No newline' with no line before it")
    for side in last:
        if side and side[-1].endswith(b"\n"):
            side[-1] = side[-1][:-1]


def _parse_binary(lines: list[bytes], i: int, patch: FilePatch) -> int:
    header = lines[i].rstrip(b"\n") if i < len(lines) else b""
    if not header.startswith(b"literal "):
        patch.binary_unsupported = True
        while i < len(lines) and not lines[i].startswith(b"diff --git "):
            i += 1
        return i
    digits = header[8:]
    if not digits.isdigit() or len(digits) > 18:  # 18 digits still fit zlib's max_length
        raise _corrupt(i + 1, f"{header[:40]!r} is not 'literal SIZE'")
    size = int(digits)
    if size > MAX_LITERAL_BYTES:
        raise CcwError("TOO_LARGE", f"binary literal at line {i + 1} is {size} bytes, "
                       f"over the {MAX_LITERAL_BYTES >> 20} MiB a patch may carry; "
                       "copy such a file into the workspace (or the capsule) directly",
                       {"line": i + 1, "size": size, "limit": MAX_LITERAL_BYTES})
    i += 1
    encoded = bytearray()
    while i < len(lines) and lines[i].rstrip(b"\n"):
        row = lines[i].rstrip(b"\n")
        # git's length byte: A-Z for 1-26 bytes, a-z for 27-52.
        count = row[0] - 64 if 65 <= row[0] <= 90 else row[0] - 70 if 97 <= row[0] <= 122 else 0
        try:
            chunk = base64.b85decode(row[1:])
        except ValueError:
            chunk = b""
        if not count or len(chunk) < count:
            raise _corrupt(i + 1, "binary literal line is not git's base85")
        encoded += chunk[:count]
        i += 1
    # Inflate at most one byte past the announced size: a small patch must not be able to
    # inflate to gigabytes before the size check.
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(bytes(encoded), size + 1)
    except zlib.error as exc:
        raise _corrupt(i, f"binary literal does not inflate ({exc})") from None
    if len(data) != size or not inflater.eof:
        raise _corrupt(i, "binary literal has the wrong size")
    patch.binary = data
    # Skip the reverse hunk, if any, up to the next file diff.
    while i < len(lines) and not lines[i].startswith(b"diff --git "):
        i += 1
    return i
