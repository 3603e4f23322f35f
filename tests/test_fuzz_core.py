"""Fuzzing the pure parsers (issue 9): the patch parser and applier, path normalisation
(seed 000 and seed 004) and hashline op parsing.  Only the module's own structured
errors may come out (CcwError, never INTERNAL), and what they accept must be safe.

Existing property tests already compare seed 000's ``normalize`` with a reference model
on a small alphabet (tests/test_substrate_core.py); here: any text at all, idempotence
for both normalisers, and that nothing normalised ever climbs out of the root.
"""

from __future__ import annotations

import json
import posixpath

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp_server.core import hashline, paths, rootspace
from sandbox.errors import CcwError
from tests.support.patch_fuzz import check_patch

FUZZ = settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])

path_text = st.one_of(
    st.text(max_size=80),
    st.text(alphabet="./~\\:aC\x00\udc80\ud800é", max_size=40),
    st.lists(st.sampled_from(["..", ".", "", "a", "~", "~x", "b~", "\\", "C:", "\x00", "é", "\udcff"]),
             max_size=12).map("/".join),
)


def _stays_inside(normal: str) -> bool:
    joined = posixpath.normpath(posixpath.join("/root", normal))
    return joined == "/root" or joined.startswith("/root/")


@FUZZ
@given(path_text)
def test_seed000_normalize_never_escapes_and_is_idempotent(raw: str) -> None:
    try:
        normal = paths.normalize(raw)
    except CcwError as exc:
        assert exc.code in ("INVALID_ARGUMENT", "PERMISSION_DENIED")
        json.dumps(exc.to_dict())
        return
    assert normal == "." or not normal.startswith("/")
    assert ".." not in normal.split("/") and "\x00" not in normal
    assert not any(part.startswith("~") for part in normal.split("/"))
    assert _stays_inside(normal)
    assert paths.normalize(normal) == normal


@FUZZ
@given(path_text)
def test_rootspace_normalize_never_escapes_and_is_idempotent(raw: str) -> None:
    try:
        normal = rootspace.normalize_path(raw)
    except CcwError as exc:
        assert exc.code in ("INVALID_ARGUMENT", "PERMISSION_DENIED")
        return
    assert not normal.startswith("/") and ".." not in normal.split("/") and "\\" not in normal
    assert "\x00" not in normal and _stays_inside(normal)
    # The form shown back to agents ('/' + path) normalises to itself.  (The bare form need
    # not: '/C:' is the file 'C:' in the root, but 'C:' alone reads as a drive and is refused.)
    assert rootspace.normalize_path(rootspace.display_path(normal)) == normal


# --- patches ---------------------------------------------------------------------------

SEED_PATCH = (
    b"diff --git a/src/a.py b/src/a.py\nindex 83db48f..bf269f4 100644\n--- a/src/a.py\n+++ b/src/a.py\n"
    b"@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
    b"diff --git a/old b/new\nsimilarity index 90%\nrename from old\nrename to new\n"
    b"diff --git a/fresh b/fresh\nnew file mode 100644\n--- /dev/null\n+++ b/fresh\n@@ -0,0 +1,2 @@\n+x\n+y\n"
    b"\\ No newline at end of file\n"
    b'--- "a/q\\303\\251"\n+++ "b/q\\303\\251"\n@@ -1 +1 @@\n-a\n+b\n'
)  # changes, renames and adds files of tests.support.patch_fuzz.TREE


@FUZZ
@given(st.binary(max_size=400))
def test_patch_parser_on_random_bytes(data: bytes) -> None:
    check_patch(data)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(SEED_PATCH)), st.integers(0, 40), st.binary(max_size=12)), max_size=6))
def test_patch_parser_on_mutated_diffs(edits: list[tuple[int, int, bytes]]) -> None:
    data = bytearray(SEED_PATCH)
    for at, cut, insert in edits:
        data[at:at + cut] = insert
    check_patch(bytes(data))


LINE = st.sampled_from([
    b"diff --git a/x b/x", b"diff --git a/../x b/x", b"--- a/x", b"+++ b/x", b"--- /dev/null", b"+++ /dev/null",
    b"+++ b/../../x", b"+++ /etc/x", b'+++ "b/\\056\\056/x"', b"@@ -1 +1 @@", b"@@ -0,0 +1,3 @@", b"@@ -1,2 +1 @@",
    b"@@ -99999999999999999999 +1 @@", b" one", b"-two", b"+TWO", b"\\ No newline at end of file",
    b"new file mode 100644", b"new file mode 120000", b"deleted file mode 100644", b"old mode 100644",
    b"new mode 100755", b"rename from x", b"rename to ../y", b"copy from x", b"copy to y", b"similarity index 100%",
    b"index 0000000..1111111 100644", b"GIT binary patch", b"literal 5", b"delta 3", b"McmZ?wbaHd^00Ahz0RR91",
    b"zzzz", b"", b"\xff\xfe",
])


@FUZZ
@given(st.lists(LINE, max_size=30))
def test_patch_parser_on_shuffled_diff_lines(lines: list[bytes]) -> None:
    check_patch(b"\n".join(lines) + b"\n")


# --- hashline ops ----------------------------------------------------------------------

json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
anchor_text = st.one_of(
    st.text(max_size=20),
    st.from_regex(r"\A-?[0-9]{1,3}:[0-9a-f]{0,3}(\.\.[0-9]{1,3}:[0-9a-f]{0,3})?\Z"),
    st.sampled_from(["0:", "0", "1:zz", "1:..2:", "..", "1:00..", "\ud800", "99999999999999999999:ab"]),
)
op_object = st.fixed_dictionaries(
    {},
    optional={
        "op": st.one_of(st.sampled_from(list(hashline.OPS)), json_value),
        "anchor": st.one_of(anchor_text, json_value),
        "content": st.one_of(st.text(max_size=30), json_value, st.just("\ud800")),
        "extra": json_value,
    },
)
op_string = st.one_of(
    st.text(max_size=40),
    st.builds(lambda op, a, c: f"{op} {a} with {c}", st.sampled_from(list(hashline.OPS)), anchor_text,
              st.text(max_size=10)),
)
DOC = b"alpha\nbeta\r\ngamma\n\nalpha\n"


@FUZZ
@given(st.lists(st.one_of(op_object, op_string), min_size=1, max_size=5))
def test_hashline_ops_raise_only_ccw_errors(ops: list[object]) -> None:
    for index, raw in enumerate(ops):
        try:
            hashline.parse_op(raw, index)  # type: ignore[arg-type]
        except CcwError as exc:
            assert exc.code == "INVALID_ARGUMENT", exc
    try:
        result = hashline.edit(DOC, hashline.file_hash(DOC), ops, "f.txt")  # type: ignore[arg-type]
    except CcwError as exc:
        assert exc.code in ("INVALID_ARGUMENT", "STALE_FILE", "CONFLICT", "NOT_FOUND", "AMBIGUOUS"), exc
        json.dumps(exc.to_dict())
        return
    result.text.encode("utf-8")


@FUZZ
@given(st.binary(max_size=200), st.text(max_size=70))
def test_hashline_edit_on_random_files(data: bytes, hash_text: str) -> None:
    try:
        hashline.edit(data, hash_text, [{"op": "insert_after", "anchor": "0:", "content": "x"}], "f")
    except CcwError as exc:
        assert exc.code != "INTERNAL"
