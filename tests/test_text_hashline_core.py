"""Hashline core (seed 002): FNV-1a tags, splitting, op parsing, anchor resolution, edits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_server.core import hashline
from mcp_server.core.hashline import edit, file_hash, fnv1a32, line_tag, split_text, tags
from sandbox.errors import CcwError

# Published FNV-1a 32-bit test vectors (Fowler/Noll/Vo, isthe.com/chongo/src/fnv/test_fnv.c).
FNV1A_32_VECTORS = [
    (b"", 0x811C9DC5),
    (b"a", 0xE40C292C),
    (b"b", 0xE70C2DE5),
    (b"c", 0xE60C2C52),
    (b"d", 0xE10C2473),
    (b"e", 0xE00C22E0),
    (b"f", 0xE30C2799),
    (b"fo", 0x6222E842),
    (b"foo", 0xA9F37ED7),
    (b"foob", 0x3F5076EF),
    (b"fooba", 0x39AAA18A),
    (b"foobar", 0xBF9CF968),
    (b"\x00", 0x050C5D1F),
    (b"a\x00", 0x2B24D044),
    (b"foobar\x00", 0x0C1C9EB8),
]


@pytest.mark.parametrize(("data", "expected"), FNV1A_32_VECTORS)
def test_fnv1a32_matches_published_vectors(data: bytes, expected: int) -> None:
    assert fnv1a32(data) == expected


@pytest.mark.parametrize(("data", "expected"), FNV1A_32_VECTORS)
def test_tag_is_low_byte_of_fnv1a(data: bytes, expected: int) -> None:
    text = data.decode()
    if text.rstrip() != text:
        return
    assert line_tag(text) == f"{expected & 0xFF:02x}"
    assert tags([text] * 40) == [f"{expected & 0xFF:02x}"] * 40


def test_tag_ignores_trailing_whitespace_only() -> None:
    assert line_tag("foo  \t") == line_tag("foo") == "d7"
    assert line_tag("  foo") != line_tag("foo")


@given(st.lists(st.text(max_size=120), max_size=80))
def test_vectorised_tags_equal_scalar_tags(lines: list[str]) -> None:
    lines = [line.replace("\n", "") for line in lines]
    expected = [f"{fnv1a32(line.rstrip().encode()) & 0xFF:02x}" for line in lines]
    assert tags(lines) == expected
    assert [line_tag(line) for line in lines] == expected


@given(st.lists(st.text(st.characters(max_codepoint=127), max_size=120), min_size=16, max_size=80))
def test_vectorised_tags_of_ascii_lines_equal_scalar_tags(lines: list[str]) -> None:
    # ASCII text takes its own path (the matrix built from str rows); control characters
    # and even a "\n" inside a line included.
    assert tags(lines) == [f"{fnv1a32(line.rstrip().encode()) & 0xFF:02x}" for line in lines]


def test_vectorised_tags_on_many_lines_of_mixed_lengths() -> None:
    lines = [("x" * (i % 300)) + str(i) + (" " * (i % 3)) for i in range(3000)]
    assert tags(lines) == [f"{fnv1a32(line.rstrip().encode()) & 0xFF:02x}" for line in lines]


@pytest.mark.parametrize("char", ["é", "x"])
def test_vectorised_tags_on_very_uneven_lengths(char: str) -> None:
    # Mostly short lines and a few long ones: the length-sorted grouping path.
    lines = [(char * (2000 if i % 97 == 0 else i % 7)) + str(i) for i in range(2000)]
    assert tags(lines) == [f"{fnv1a32(line.rstrip().encode()) & 0xFF:02x}" for line in lines]


@pytest.mark.parametrize(
    ("text", "lines", "final"),
    [
        ("", [], False),
        ("\n", [""], True),
        ("a", ["a"], False),
        ("a\nb\n", ["a", "b"], True),
        ("a\r\nb", ["a", "b"], False),
        ("a\r", ["a\r"], False),
        ("a\u2028b\x0cc\n", ["a\u2028b\x0cc"], True),
    ],
)
def test_split_text_only_on_lf_and_round_trips(text: str, lines: list[str], final: bool) -> None:
    doc = split_text(text)
    assert doc.lines == lines
    assert doc.final_newline is final
    assert doc.render() == text


def _read(data: bytes) -> tuple[str, list[str]]:
    doc = split_text(data.decode())
    return file_hash(data), [f"{n}:{t}" for n, t in enumerate(tags(doc.lines), 1)]


FILES = {
    "lf": b"def f():\n    return 1\n\nprint(f())\n",
    "crlf": b"def f():\r\n    return 1\r\n\r\nprint(f())\r\n",
    "no_final_newline": b"def f():\n    return 1\n\nprint(f())",
    "crlf_no_final_newline": b"def f():\r\n    return 1\r\n\r\nprint(f())",
}


def _nl(kind: str) -> str:
    return "\r\n" if kind.startswith("crlf") else "\n"


def _expect(kind: str, lines: list[str]) -> bytes:
    nl = _nl(kind)
    final = not kind.endswith("no_final_newline")
    return (nl.join(lines) + (nl if final else "")).encode()


OP_CASES = [
    ("replace", lambda t: {"op": "replace", "anchor": t[1], "content": "    return 2"},
     ["def f():", "    return 2", "", "print(f())"]),
    ("replace_multi", lambda t: {"op": "replace", "anchor": t[1], "content": "    x = 2\n    return x\n"},
     ["def f():", "    x = 2", "    return x", "", "print(f())"]),
    ("replace_range",
     lambda t: {"op": "replace_range", "anchor": f"{t[0]}..{t[1]}", "content": "def g():\n    return 3"},
     ["def g():", "    return 3", "", "print(f())"]),
    ("insert_after", lambda t: {"op": "insert_after", "anchor": t[3], "content": "print('done')"},
     ["def f():", "    return 1", "", "print(f())", "print('done')"]),
    ("insert_before", lambda t: {"op": "insert_before", "anchor": t[0], "content": "import os"},
     ["import os", "def f():", "    return 1", "", "print(f())"]),
    ("insert_top", lambda t: {"op": "insert_after", "anchor": "0", "content": "# header"},
     ["# header", "def f():", "    return 1", "", "print(f())"]),
    ("delete", lambda t: {"op": "delete", "anchor": t[2]}, ["def f():", "    return 1", "print(f())"]),
    ("delete_last", lambda t: {"op": "delete", "anchor": t[3]}, ["def f():", "    return 1", ""]),
    ("delete_range", lambda t: {"op": "delete_range", "anchor": f"{t[1]}..{t[2]}"}, ["def f():", "print(f())"]),
    ("replace_last", lambda t: {"op": "replace", "anchor": t[3], "content": "main()"},
     ["def f():", "    return 1", "", "main()"]),
]


@pytest.mark.parametrize("kind", sorted(FILES))
@pytest.mark.parametrize(("name", "make", "want"), OP_CASES, ids=[c[0] for c in OP_CASES])
def test_every_op_on_every_line_ending(kind: str, name: str, make, want: list[str]) -> None:  # type: ignore[no-untyped-def]
    data = FILES[kind]
    h, t = _read(data)
    result = edit(data, h, [make(t)], "f.py")
    assert result.text.encode() == _expect(kind, want)
    assert result.moved == []


def test_text_form_ops_match_object_ops() -> None:
    data = FILES["lf"]
    h, t = _read(data)
    ops = [f"replace {t[1]} with '    return \"hello\"'", f"insert_before {t[0]} '# greeting'", f"delete {t[2]}"]
    assert edit(data, h, ops, "f.py").text == '# greeting\ndef f():\n    return "hello"\nprint(f())\n'


def test_several_ops_apply_against_the_same_original() -> None:
    data = b"a\nb\nc\nd\ne\n"
    h, t = _read(data)
    ops = [
        {"op": "delete", "anchor": t[0]},
        {"op": "replace", "anchor": t[2], "content": "C1\nC2"},
        {"op": "insert_after", "anchor": t[4], "content": "f"},
        {"op": "insert_before", "anchor": t[3], "content": "before-d"},
    ]
    assert edit(data, h, ops, "x").text == "b\nC1\nC2\nbefore-d\nd\ne\nf\n"


def test_empty_file_takes_lines_at_the_top_with_a_final_newline() -> None:
    h, t = _read(b"")
    assert t == []
    assert edit(b"", h, [{"op": "insert_after", "anchor": "0:", "content": "first"}], "x").text == "first\n"


def test_deleting_every_line_leaves_an_empty_file() -> None:
    data = b"a\nb"
    h, t = _read(data)
    assert edit(data, h, [{"op": "delete_range", "anchor": f"{t[0]}..{t[1]}"}], "x").text == ""


def test_mixed_endings_survive_and_new_lines_take_the_dominant_one() -> None:
    data = b"a\r\nb\nc\r\nd\r\n"
    h, t = _read(data)
    out = edit(data, h, [{"op": "insert_after", "anchor": t[1], "content": "new"}], "x").text
    assert out == "a\r\nb\nnew\r\nc\r\nd\r\n"


def test_hundred_thousand_line_file() -> None:
    lines = [f"line {i} = value_{i * 7 % 1000}" for i in range(100_000)]
    data = ("\n".join(lines) + "\n").encode()
    h, t = _read(data)
    ops = [
        {"op": "replace", "anchor": t[0], "content": "FIRST"},
        {"op": "insert_after", "anchor": t[49_999], "content": "MIDDLE"},
        {"op": "delete", "anchor": t[99_999]},
    ]
    try:
        out = edit(data, h, ops, "big").text.split("\n")
    except CcwError as exc:  # an anchor's line number did not match and its hash repeats
        pytest.fail(f"exact anchors must resolve: {exc}")
    assert out[0] == "FIRST"
    assert out[50_000] == "MIDDLE"
    assert out[-2] == lines[99_998] and out[-1] == ""
    assert len(out) == 100_001


def test_stale_file_hash_rejected_with_fresh_tags() -> None:
    old = b"a\nb\nc\n"
    h, t = _read(old)
    new = b"a\nB\nc\n"
    with pytest.raises(CcwError) as info:
        edit(new, h, [{"op": "replace", "anchor": t[1], "content": "x"}], "f")
    err = info.value
    assert err.code == "CONFLICT"
    assert err.details["reason"] == "stale_file_hash"
    assert err.details["file_hash"] == file_hash(new)
    around = err.details["context"][t[1]]["around"]
    assert f"2:{line_tag('B')}|B" in around
    assert "read_text_file" in err.message


def test_moved_anchor_resolves_to_the_unique_line_with_that_hash() -> None:
    data = b"alpha\nbeta\ngamma\n"
    h, _ = _read(data)
    tag = line_tag("gamma")
    assert tag not in (line_tag("alpha"), line_tag("beta"))
    result = edit(data, h, [{"op": "replace", "anchor": f"1:{tag}", "content": "GAMMA"}], "f")
    assert result.text == "alpha\nbeta\nGAMMA\n"
    assert result.moved == [{"op_index": 0, "from": 1, "to": 3}]


def test_ambiguous_anchor_rejects_whole_edit_with_context() -> None:
    data = b"x = 1\nsame\nother\nsame\n"
    h, t = _read(data)
    wrong = f"3:{line_tag('same')}"
    assert line_tag("other") != line_tag("same")
    with pytest.raises(CcwError) as info:
        edit(data, h, [{"op": "delete", "anchor": t[0]}, {"op": "delete", "anchor": wrong}], "f")
    err = info.value
    assert err.code == "CONFLICT"
    assert err.details["reason"] == "anchor_ambiguous"
    ctx = err.details["context"][wrong]
    assert ctx["lines_with_hash"] == [2, 4]
    assert f"3:{line_tag('other')}|other" in ctx["around"]


def test_absent_anchor_rejected() -> None:
    data = b"one\ntwo\n"
    h, _ = _read(data)
    missing = next(f"{n:02x}" for n in range(256) if f"{n:02x}" not in (line_tag("one"), line_tag("two")))
    with pytest.raises(CcwError) as info:
        edit(data, h, [{"op": "replace", "anchor": f"2:{missing}", "content": "x"}], "f")
    assert info.value.details["reason"] == "anchor_not_found"
    assert info.value.details["context"][f"2:{missing}"]["around"] == [f"1:{line_tag('one')}|one",
                                                                      f"2:{line_tag('two')}|two"]


@pytest.mark.parametrize(
    "ops",
    [
        lambda t: [{"op": "replace", "anchor": t[1], "content": "x"}, {"op": "delete", "anchor": t[1]}],
        lambda t: [{"op": "delete_range", "anchor": f"{t[0]}..{t[2]}"},
                   {"op": "replace", "anchor": t[2], "content": "x"}],
        lambda t: [{"op": "insert_after", "anchor": t[0], "content": "x"},
                   {"op": "insert_before", "anchor": t[1], "content": "y"}],
        lambda t: [{"op": "insert_after", "anchor": t[1], "content": "x"}, {"op": "delete", "anchor": t[1]}],
        lambda t: [{"op": "insert_after", "anchor": t[0], "content": "x"},
                   {"op": "insert_after", "anchor": t[0], "content": "y"}],
    ],
)
def test_overlapping_ops_rejected(ops) -> None:  # type: ignore[no-untyped-def]
    data = b"a\nb\nc\n"
    h, t = _read(data)
    with pytest.raises(CcwError) as info:
        edit(data, h, ops(t), "f")
    assert info.value.code == "INVALID_ARGUMENT"
    assert "overlap" in info.value.message


@pytest.mark.parametrize(
    "op",
    [
        {"op": "frobnicate", "anchor": "1:00"},
        {"op": "replace", "anchor": "1:zz", "content": "x"},
        {"op": "replace", "anchor": "1:00"},
        {"op": "delete", "anchor": "1:00", "content": "x"},
        {"op": "replace_range", "anchor": "1:00", "content": "x"},
        {"op": "insert_after", "anchor": "1:00..2:00", "content": "x"},
        "replace 1:00",
        "replace 'unterminated",
    ],
)
def test_malformed_ops_are_instructional_errors(op: object) -> None:
    with pytest.raises(CcwError) as info:
        hashline.parse_op(op, 0)  # type: ignore[arg-type]
    assert info.value.code == "INVALID_ARGUMENT"
    assert "op 0" in info.value.message


def test_backwards_range_rejected() -> None:
    data = b"a\nb\n"
    h, t = _read(data)
    with pytest.raises(CcwError, match="backwards"):
        edit(data, h, [{"op": "delete_range", "anchor": f"{t[1]}..{t[0]}"}], "f")


def test_pasted_tag_with_content_is_accepted_as_anchor() -> None:
    data = b"a\nb\n"
    h, t = _read(data)
    assert edit(data, h, [{"op": "delete", "anchor": f"{t[0]}|a"}], "f").text == "b\n"


def test_invalid_utf8_suggests_base64() -> None:
    with pytest.raises(CcwError, match="base64"):
        edit(b"\xff\xfe", file_hash(b"\xff\xfe"), [{"op": "delete", "anchor": "1:00"}], "bin")


@given(st.text(alphabet="ab \r\n", max_size=60))
def test_split_and_render_round_trip_any_line_endings(text: str) -> None:
    doc = split_text(text)
    assert doc.render() == text
    assert len(doc.lines) == len(doc.endings)
    assert all(end in ("\n", "\r\n") for end in doc.endings[:-1])


@given(st.text(alphabet="ab\r\n", min_size=1, max_size=40), st.integers(min_value=0, max_value=50))
def test_insert_then_delete_restores_the_file(text: str, where: int) -> None:
    data = text.encode()
    doc = split_text(text)
    if not doc.lines:
        return
    n = where % len(doc.lines) + 1
    tag = line_tag(doc.lines[n - 1])
    inserted = edit(data, file_hash(data), [{"op": "insert_after", "anchor": f"{n}:{tag}", "content": "zz-new"}], "f")
    new_doc = inserted.doc
    assert new_doc.lines[n] == "zz-new"
    assert new_doc.final_newline == doc.final_newline
    back = edit(inserted.text.encode(), file_hash(inserted.text.encode()),
                [{"op": "delete", "anchor": f"{n + 1}:{line_tag('zz-new')}"}], "f")
    if doc.final_newline or n < len(doc.lines):
        # The inserted line took the file's dominant ending; all others kept theirs.
        assert back.doc.lines == doc.lines
        assert back.doc.final_newline == doc.final_newline


@st.composite
def _doc_and_ops(draw: st.DrawFn) -> tuple[list[str], list[dict[str, str]]]:
    count = draw(st.integers(min_value=1, max_value=30))
    lines = [f"line {i}" for i in range(count)]
    taken: set[int] = set()  # original lines touched by some op (spans and insert anchors)
    gaps: set[int] = set()
    ops = []
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        kind = draw(st.sampled_from(hashline.OPS))
        first = draw(st.integers(min_value=1, max_value=count))
        last = draw(st.integers(min_value=first, max_value=min(count, first + 3))) if kind.endswith("_range") else first
        span = set(range(first, last + 1))
        gap = first if kind == "insert_after" else first - 1
        if kind.startswith("insert"):
            if first in {n for n in taken if n > 0} or gap in gaps:
                continue
            gaps.add(gap)
            taken.add(-first)  # an insert anchor: spans may not cover it
        else:
            if span & {abs(n) for n in taken}:
                continue
        taken |= span if not kind.startswith("insert") else set()
        tag = line_tag(lines[first - 1])
        anchor = f"{first}:{tag}" + (f"..{last}:{line_tag(lines[last - 1])}" if kind.endswith("_range") else "")
        op = {"op": kind, "anchor": anchor}
        if not kind.startswith("delete"):
            op["content"] = draw(st.sampled_from(["new", "x\ny", "p\nq\nr"]))
        ops.append(op)
    return lines, ops


@given(_doc_and_ops())
def test_multi_op_edits_match_a_naive_model(case: tuple[list[str], list[dict[str, str]]]) -> None:
    lines, ops = case
    if not ops:
        return
    data = ("\n".join(lines) + "\n").encode()
    # The model: apply ops from the bottom of the file up, so earlier positions hold.
    model = list(lines)
    keyed = []
    for op in ops:
        first = int(op["anchor"].split(":")[0])
        last = int(op["anchor"].split("..")[1].split(":")[0]) if ".." in op["anchor"] else first
        new = op.get("content", "").split("\n") if "content" in op else []
        if op["op"] == "insert_after":
            keyed.append((first, 0, first, first, new))
        elif op["op"] == "insert_before":
            keyed.append((first - 1, 0, first - 1, first - 1, new))
        else:
            keyed.append((first - 1, 1, first - 1, last, new))
    for _, _, lo, hi, new in sorted(keyed, key=lambda k: (k[0], k[1]), reverse=True):
        model[lo:hi] = new
    try:
        result = edit(data, file_hash(data), ops, "f")
    except CcwError as exc:
        raise AssertionError(f"{ops}: {exc.message}") from exc
    assert result.doc.lines == model
    assert result.text == "".join(line + "\n" for line in model)
    assert result.tags is None
    # Given the old tags (as a cache would), the new ones are spliced, not recomputed.
    spliced = edit(data, file_hash(data), ops, "f", known_tags=tags(lines))
    assert spliced.tags == tags(model)
