"""RootSpace core (seed 004): paths MCP-025..028, ranges MCP-040..042, text ops MCP-031..046."""

from __future__ import annotations

import base64
import hashlib

import pytest

from mcp_server.core.rootspace import (
    TextState,
    append,
    check_hash,
    decode_content,
    insert,
    normalize_path,
    read_range,
    replace,
    resolve_range,
)
from sandbox.errors import CcwError

# --- paths ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("/", ""),  # MCP-025: a leading / is the root
        ("/src/a.py", "src/a.py"),
        ("src/a.py", "src/a.py"),  # same file without the leading /
        ("//src///a.py", "src/a.py"),  # MCP-026: // collapsed
        ("/./src/./a.py/.", "src/a.py"),  # . removed
        ("/src/lib/../a.py", "src/a.py"),  # .. resolved
        ("src/..", ""),
        ("/a/b/../../c", "c"),
        (".", ""),
        ("src/", "src"),
        ("/.hidden", ".hidden"),
        ("~/x", "~/x"),  # no home expansion: '~' is an ordinary name
    ],
)
def test_paths_are_normalised_within_the_root(given: str, normal: str) -> None:
    assert normalize_path(given) == normal


@pytest.mark.parametrize("escape", ["..", "/..", "/../etc/passwd", "a/../../b", "/a/b/../../../x", "./.."])
def test_dotdot_above_the_root_is_rejected_not_clamped(escape: str) -> None:  # MCP-027
    with pytest.raises(CcwError) as info:
        normalize_path(escape)
    assert info.value.code == "PERMISSION_DENIED"
    assert "inside the root" in info.value.message


@pytest.mark.parametrize("windows", ["C:\\Users\\x", "c:/x", "C:", "D:\\", "\\\\server\\share", "\\x", "src\\a.py"])
def test_platform_absolute_forms_are_rejected(windows: str) -> None:  # MCP-028
    with pytest.raises(CcwError) as info:
        normalize_path(windows)
    assert info.value.code == "INVALID_ARGUMENT"
    assert "'/'" in info.value.message


def test_nul_rejected() -> None:
    with pytest.raises(CcwError):
        normalize_path("a\x00b")


# --- ranges --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "lo_hi"),
    [
        (None, (0, 10)),
        ([1, 11], (0, 10)),  # MCP-040: 1-indexed, end exclusive
        ([2, 5], (1, 4)),  # lines 2, 3, 4
        ([3, 4], (2, 3)),  # one line
        ([3, 3], (2, 2)),  # empty
        ([1, 0], (0, 10)),  # MCP-042: 0 end = to the end
        ([0, 0], (0, 10)),  # both open
        ([0, 4], (0, 3)),  # 0 start = from the top
        ([-3, 0], (7, 10)),  # MCP-041: last three lines
        ([-1, 0], (9, 10)),  # last line
        ([1, -1], (0, 9)),  # all but the last
        ([-4, -2], (6, 8)),  # lines 7 and 8
        ([5, 500], (4, 10)),  # end past the file clamps
        ([-50, 0], (0, 10)),  # negative start past the top clamps
        ([11, 0], (10, 10)),  # start just after the last line: empty
    ],
)
def test_every_range_form(lines: list[int] | None, lo_hi: tuple[int, int]) -> None:
    assert resolve_range(lines, 10) == lo_hi


@pytest.mark.parametrize("lines", [[12, 0], [5, 3], [-2, -5], [1, -20], [1], [1, 2, 3], [True, 2]])
def test_bad_ranges_say_how_long_the_file_is(lines: list[int]) -> None:
    with pytest.raises(CcwError) as info:
        resolve_range(lines, 10)
    assert info.value.code == "INVALID_ARGUMENT"
    assert "[start, end]" in info.value.message or "10 lines" in info.value.message or "of 10" in info.value.message


def test_ranges_on_an_empty_file() -> None:
    assert resolve_range([0, 0], 0) == (0, 0)
    assert resolve_range([1, 0], 0) == (0, 0)
    assert resolve_range([-1, 0], 0) == (0, 0)
    with pytest.raises(CcwError):
        resolve_range([2, 0], 0)


# --- text ops ------------------------------------------------------------------------

KINDS = {
    "lf": ("\n", True),
    "crlf": ("\r\n", True),
    "lf_no_final": ("\n", False),
    "crlf_no_final": ("\r\n", False),
}


def _file(kind: str, lines: list[str]) -> bytes:
    nl, final = KINDS[kind]
    return (nl.join(lines) + (nl if final and lines else "")).encode()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_read_range_keeps_exact_bytes(kind: str) -> None:
    state = TextState.parse(_file(kind, ["a", "b", "c"]), "/f")
    assert state.hash == hashlib.sha256(state.data).hexdigest()  # MCP-031
    assert state.total_lines == 3
    assert read_range(state, None).encode() == state.data
    nl = KINDS[kind][0]
    assert read_range(state, [2, 3]) == "b" + nl
    assert read_range(state, [-1, 0]) == ("c" + nl if KINDS[kind][1] else "c")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_replace_insert_append_keep_endings(kind: str) -> None:
    state = TextState.parse(_file(kind, ["a", "b", "c"]), "/f")
    assert replace(state, [1, 0], "b", "B1\nB2", "/f").encode() == _file(kind, ["a", "B1", "B2", "c"])
    assert replace(state, [0, 0], "b\nc\n", "", "/f").encode() == _file(kind, ["a"])
    assert replace(state, [-1, 0], "c", "C", "/f").encode() == _file(kind, ["a", "b", "C"])
    assert insert(state, 2, "b", "x\ny", "/f").encode() == _file(kind, ["a", "x", "y", "b", "c"])
    assert insert(state, -1, "c", "z", "/f").encode() == _file(kind, ["a", "b", "z", "c"])
    assert append(state, "d\ne").encode() == _file(kind, ["a", "b", "c", "d", "e"])


def test_old_must_be_whole_lines_within_the_range() -> None:
    state = TextState.parse(b"x = 1\ny = 2\nx = 1\n", "/f")
    with pytest.raises(CcwError) as info:
        replace(state, [0, 0], "x = 1", "x = 3", "/f")  # twice in the file
    assert info.value.details["matches"] == [1, 3]
    assert "Narrow lines" in info.value.message
    assert replace(state, [2, 0], "x = 1", "x = 3", "/f") == "x = 1\ny = 2\nx = 3\n"
    with pytest.raises(CcwError) as info:
        replace(state, [1, 3], "x =", "z", "/f")  # a part of a line is not a line
    assert info.value.details["current_lines"] == ["1|x = 1", "2|y = 2"]
    with pytest.raises(CcwError):
        replace(state, [2, 3], "x = 1", "z", "/f")  # outside the range


def test_insert_anchor_must_be_the_full_line() -> None:
    state = TextState.parse(b"def f():\n    pass\n", "/f")
    with pytest.raises(CcwError) as info:
        insert(state, 1, "    pass", "# c", "/f")
    assert info.value.details["anchor_found_at"] == [2]
    assert "line(s) [2]" in info.value.message
    with pytest.raises(CcwError, match="text_append"):
        insert(state, 3, "x", "y", "/f")
    with pytest.raises(CcwError):
        insert(state, 0, "def f():", "y", "/f")


def test_append_to_empty_file_writes_content_as_given() -> None:
    assert append(TextState.parse(b"", "/f"), "a\nb") == "a\nb"


def test_hundred_thousand_lines() -> None:
    data = "".join(f"row {i}\n" for i in range(100_000)).encode()
    state = TextState.parse(data, "/big")
    assert state.total_lines == 100_000
    assert read_range(state, [-2, 0]) == "row 99998\nrow 99999\n"
    out = replace(state, [50_000, 50_002], "row 50000", "ROW", "/big")
    assert out.count("\n") == 100_000 and "\nROW\n" in out


def test_stale_hash_says_to_reread() -> None:
    with pytest.raises(CcwError) as info:
        check_hash("0" * 64, "f" * 64, "/f")
    assert info.value.code == "CONFLICT"
    assert "text_read" in info.value.message
    check_hash("sha256:" + "F" * 64, "f" * 64, "/f")


def test_invalid_utf8_suggests_base64() -> None:
    with pytest.raises(CcwError, match="base64"):
        TextState.parse(b"ok\n\xc3\x28", "/bin")


def test_encodings() -> None:
    assert decode_content("héllo", "utf-8") == "héllo".encode()
    assert decode_content(base64.b64encode(b"\x00\xff").decode(), "base64") == b"\x00\xff"
    with pytest.raises(CcwError, match="base64"):
        decode_content("not base64!", "base64")
    with pytest.raises(CcwError, match="utf-8"):
        decode_content("x", "latin-1")
