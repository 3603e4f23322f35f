"""File names that are not UTF-8 (sandbox/rawnames.py): their display form reads back byte for
byte, the rename argv it offers renames the file in a real sh, an exec reply carries the others
and counts and shows these (sandbox/replies.py ``Touched.carried``, execution.py's warning), and a
change list holding one is refused whole, naming it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_server.core.generations import exec_advances
from sandbox import execution, rawnames
from sandbox.errors import CcwError
from sandbox.protocol import decode_body, encode_reply
from sandbox.replies import Change, ChangesReply, GitdirChanges, Touched

BAD = os.fsdecode(b"n\xff.txt")  # what os.listdir gives for that name


@given(st.binary(min_size=1, max_size=40).filter(lambda b: b"/" not in b and b"\0" not in b))
def test_display_is_text_and_reads_back_to_the_same_bytes(name: bytes) -> None:
    shown = rawnames.display(os.fsdecode(name))
    shown.encode("utf-8")  # always carried
    assert rawnames.name_bytes(shown) == name


def test_display_cannot_be_confused_with_a_utf8_name_spelling_an_escape() -> None:
    literal = "n\\xff.txt"  # a UTF-8 name with a backslash, an x and two f
    assert rawnames.display(BAD) == "n\\xff.txt" and rawnames.display(literal) == "n\\\\xff.txt"
    assert rawnames.carried(literal) and not rawnames.carried(BAD)
    with pytest.raises(ValueError, match="starts no escape"):
        rawnames.name_bytes("a\\q")


def test_the_rename_argv_renames_the_file_in_a_real_shell(tmp_path: Path) -> None:
    name = os.fsdecode(b"n\xff $\"'\\%`.txt\n")  # quotes, a dollar, a percent and a trailing newline
    (tmp_path / name).write_text("x")
    argv = rawnames.rename_argv(name)
    assert all(rawnames.carried(part) for part in argv)
    argv[2] = argv[2].replace("NEW_NAME", "renamed.txt")
    subprocess.run(argv, cwd=tmp_path, check=True)
    assert os.listdir(tmp_path) == ["renamed.txt"]


def test_touched_keeps_the_carried_names_and_counts_and_shows_the_others() -> None:
    touched = Touched.carried(("a.txt", BAD), (BAD, "b.txt"), (".",), ())
    assert (touched.read, touched.written, touched.listed, touched.executed) == (("a.txt",), ("b.txt",), (".",), ())
    assert touched.not_utf8 is not None and touched.not_utf8.to_args() == {"count": 1, "written": 1,
                                                                           "names": ["n\\xff.txt"]}
    wire = touched.to_args()
    assert Touched.from_args(decode_body(encode_reply(1, wire)[4:])["result"]) == touched
    assert exec_advances(wire) and not exec_advances({**wire, "not_utf8": {**wire["not_utf8"], "written": 0},
                                                      "written": []})


def test_touched_without_such_names_is_the_wire_object_it_always_was() -> None:
    touched = Touched.carried(None, ("b.txt",), None, None)
    assert touched.not_utf8 is None
    assert touched.to_args() == {"read": None, "written": ["b.txt"], "listed": None, "executed": None}


def test_the_count_is_whole_where_the_names_shown_stop() -> None:
    many = tuple(os.fsdecode(b"x%03d\xfe" % i) for i in range(rawnames.SHOWN + 5))
    touched = Touched.carried((), many, (), ())
    assert touched.not_utf8 is not None
    assert (touched.not_utf8.count, touched.not_utf8.written, len(touched.not_utf8.names)) == (
        rawnames.SHOWN + 5, rawnames.SHOWN + 5, rawnames.SHOWN)
    assert touched.not_utf8.names[0] == "x000\\xfe"


def test_an_exec_reply_warns_and_names_the_way_out() -> None:
    touched, unavailable = execution._touched(None, "no tracer", ["ok.txt", BAD])
    assert touched.written == ("ok.txt",) and touched.not_utf8 is not None and touched.not_utf8.written == 1
    note = unavailable["not_utf8"]
    assert note.startswith("1 touched name(s) are not UTF-8") and "n\\xff.txt" in note
    assert 'mv -- \\"${f%x}\\" NEW_NAME' in note and "n\\\\377.txtx" in note  # the JSON argv, its escapes doubled
    encode_reply(1, {"touched": touched.to_args(), "touched_unavailable": unavailable})  # the reply goes out


def test_a_change_list_holding_such_a_name_is_refused_whole_naming_it() -> None:
    with pytest.raises(CcwError) as refused:
        ChangesReply((Change("a.txt", "added", "file", 0o644, 1), Change(f"d/{BAD}", "added", "file", 0o644, 1)))
    assert refused.value.code == "INVALID_ARGUMENT"
    assert refused.value.details == {"not_utf8": ["d/n\\xff.txt"], "count": 1}
    assert "nothing was listed or changed" in refused.value.message and "printf" in refused.value.message
    link = Change("l", "added", "symlink", None, None, os.fsdecode(b"t\xfe"))
    with pytest.raises(CcwError, match="t\\\\xfe"):
        ChangesReply((), (GitdirChanges("/g", (link,)),))
    assert ChangesReply((Change("é.txt", "added", "file", 0o644, 1),)).changes[0].path == "é.txt"


def test_a_refusal_offers_the_way_it_is_given_else_the_rename_in_the_capsule() -> None:
    rawnames.refuse(["a.txt", "é"], "changes")  # all carried: no refusal
    with pytest.raises(CcwError) as base:
        rawnames.refuse([f"d/{BAD}"], "changes", rawnames.IN_WORKSPACE)
    assert base.value.message.endswith(rawnames.IN_WORKSPACE) and "printf" not in base.value.message
