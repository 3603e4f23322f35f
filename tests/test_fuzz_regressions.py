"""Inputs the atheris targets (tests/fuzz/targets.py) found, kept as plain regression tests."""

from __future__ import annotations

import tracemalloc

import pytest

from mcp_server.core.patch import parse_patch
from mcp_server.core.patch_apply import apply
from mcp_server.core.unidiff import FileChange, _base85_block, numstat, render
from mcp_server.framing import LineSplitter, Oversized
from sandbox.errors import CcwError


def test_oversized_head_does_not_depend_on_chunking() -> None:
    # With a limit below HEAD_SCAN, the head of a line fed whole held the whole line, but
    # fed in pieces only the bytes up to the piece that crossed the limit.
    line = b'{"jsonrpc":"2.0","method":"m","id":7,"params":"' + b"x" * 40 + b'"}'
    whole = LineSplitter(max_frame=16).feed(line + b"\n")
    pieces = LineSplitter(max_frame=16)
    chunked = [event for at in range(0, len(line) + 1, 5) for event in pieces.feed((line + b"\n")[at:at + 5])]
    assert whole == chunked == [Oversized(line, len(line))]


# --- the patch parser and the diff renderer (targets "patch" and "unidiff") -----------


def _refused(patch: bytes) -> CcwError:
    with pytest.raises(CcwError) as caught:
        apply(parse_patch(patch), lambda path: None)
    assert caught.value.code == "INVALID_ARGUMENT"
    return caught.value


@pytest.mark.parametrize("header", [b"deleted file mode 100644", b"new file mode 100644"])
@pytest.mark.parametrize("kind", [b"rename", b"copy"])
def test_a_rename_that_is_also_a_new_or_deleted_file_is_corrupt(header: bytes, kind: bytes) -> None:
    # Found by the "patch" target: "deleted file mode" then "rename from old" left a file
    # diff renamed yet deleted, with no new path, and the applier's assertion fired.
    patch = b"diff --git a/old b/new\n%s\n%s from old\n%s to new\n" % (header, kind, kind)
    assert "both a rename or copy and a new or deleted file" in _refused(patch).message


def _literal(announced: int, data: bytes) -> bytes:
    rows = b"".join(_base85_block(data))
    return b"diff --git a/f b/f\nnew file mode 100644\nindex 0000000..1111111\nGIT binary patch\nliteral %d\n%s\n" % (
        announced, rows)


def test_text_with_a_lone_cr_renders_a_diff_that_applies() -> None:
    # bytes.splitlines() also splits on CR: "\r~4~" became two lines and the diff no
    # longer matched the file it was made from.
    old, new = b"\r~4~", b"~\n~\n4"
    result = apply(parse_patch(render(FileChange("a", old, new))), lambda path: (old, 0o100644))
    assert result.rejects == [] and result.files == {"a": (new, 0o100644)}
    assert numstat(FileChange("a", b"x\ry\n", b"x\rz\n")) == (1, 1)


def test_unterminated_quoted_name_in_git_header_is_a_corrupt_patch() -> None:
    _refused(b'diff --git "a/x b/x\n')  # was ValueError: subsection not found


def test_quoted_name_ending_in_an_escaped_backslash() -> None:
    patches = parse_patch(b'diff --git "a/x\\\\" "b/x\\\\"\nold mode 100644\nnew mode 100755\n')
    assert [(p.old_path, p.new_path) for p in patches] == [("x\\", "x\\")]


@pytest.mark.parametrize("patch", [
    b"diff --git a/x b/x\nGIT binary patch\nliteral x\n",  # was ValueError from int()
    b"diff --git a/x b/x\nGIT binary patch\nliteral -1\n",
    b"diff --git a/x b/x\nGIT binary patch\nliteral 5\nzzzz\n",  # was zlib.error
    b"diff --git a/x b/x\nGIT binary patch\nliteral 5\nA{{{{{\n",  # was ValueError from b85decode
    b"diff --git a/x b/x\nGIT binary patch\nliteral 5\n!abcde\n",  # not a length byte
])
def test_damaged_binary_literal_is_a_corrupt_patch(patch: bytes) -> None:
    _refused(patch)


def test_binary_literal_inflates_no_further_than_announced() -> None:
    bomb = _literal(5, b"\0" * (64 << 20))  # 64 MiB of zeros in a patch of ~100 KB
    assert len(bomb) < 200_000
    tracemalloc.start()
    try:
        assert "wrong size" in _refused(bomb).message
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # was: all 64 MiB inflated before the size was compared
    assert apply(parse_patch(_literal(3, b"abc")), lambda path: None).files == {"f": (b"abc", 0o100644)}


def test_dev_null_on_both_sides_is_a_corrupt_patch() -> None:
    # Read as a new *and* deleted file with no name; apply() then failed an assert.
    _refused(b"--- /dev/null\n+++ /dev/null\n@@ -0,0 +1 @@\n+x\n")


def test_binary_literal_over_the_cap_is_refused_before_inflating() -> None:
    # An honest announcement is no better: 1 GiB of zeros fits a ~1 MiB patch.
    from mcp_server.core.patch import MAX_LITERAL_BYTES

    with pytest.raises(CcwError) as caught:
        parse_patch(_literal(MAX_LITERAL_BYTES + 1, b"\0" * 1024))
    assert caught.value.code == "TOO_LARGE" and "copy such a file" in caught.value.message
    assert caught.value.details["limit"] == MAX_LITERAL_BYTES
