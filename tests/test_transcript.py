"""mcp_server/core/transcript.py: an interactive run's output read by cursor, within a bounded window."""

from __future__ import annotations

import pytest

from mcp_server.core.transcript import Reading, Transcript
from sandbox.errors import CcwError


def test_reads_go_on_from_the_cursor_each_gives() -> None:
    out = Transcript(terminal=False)
    out.append(b">>> ")
    first = out.read(0, final=False)
    assert first == Reading(">>> ", 0, 4, 0)
    out.append(b"42\n>>> ")
    assert out.read(first.cursor, final=False) == Reading("42\n>>> ", 4, 11, 0)
    assert out.read(11, final=False) == Reading("", 11, 11, 0)
    assert out.read(0, final=True).text == ">>> 42\n>>> "  # any cursor an answer gave reads again
    assert out.total == 11


def test_a_cursor_outside_the_output_is_refused() -> None:
    out = Transcript(terminal=False)
    out.append(b"abc")
    for cursor in (-1, 4):
        with pytest.raises(CcwError) as refused:
            out.read(cursor, final=False)
        assert refused.value.code == "INVALID_ARGUMENT" and refused.value.details == {"cursor": cursor, "total": 3}


def test_a_character_cut_off_waits_for_its_end_unless_the_run_has_ended() -> None:
    out = Transcript(terminal=False)
    out.append(b"caf" + "é".encode()[:1])
    held = out.read(0, final=False)
    assert held == Reading("caf", 0, 3, 0)
    out.append("é".encode()[1:])
    assert out.read(held.cursor, final=False).text == "é"
    cut = Transcript(terminal=False)
    cut.append(b"end\xc3")
    assert cut.read(0, final=True).text == "end\ufffd"  # nothing more will come: shown as replaced


def test_a_pipe_shows_escapes_as_they_are_a_terminal_does_not() -> None:
    for terminal, shown in ((False, "\x1b[31mred\x1b[0m\r\n"), (True, "red\n")):
        out = Transcript(terminal=terminal)
        out.append(b"\x1b[31mred\x1b[0m\r\n")
        assert out.read(0, final=False).text == shown


def test_a_terminal_holds_a_sequence_cut_off_until_it_is_whole() -> None:
    out = Transcript(terminal=True)
    out.append(b"\x1b[?2004h>>> \x1b[?20")
    first = out.read(0, final=False)
    assert first == Reading(">>> ", 0, 12, 0)
    out.append(b"04l\rok")
    assert out.read(first.cursor, final=False).text == "ok"


def test_the_window_keeps_the_newest_bytes_and_says_what_a_read_missed() -> None:
    out = Transcript(terminal=False, window=100)
    for index in range(30):
        out.append(b"%09d\n" % index)  # 10 bytes each, 300 in all
    assert out.total == 300 and 100 <= out.total - out.kept_from <= 125
    late = out.read(0, final=False)
    assert late.skipped == out.kept_from == late.start and late.cursor == 300
    said, _, kept = late.text.partition("\n")
    assert said == f"[ccw: {out.kept_from} bytes of output before this are no longer kept]"
    assert kept.endswith("000000029\n") and len(kept) == 300 - out.kept_from
    assert out.read(290, final=False) == Reading("000000029\n", 290, 300, 0)


def test_a_terminal_keeps_its_head_for_the_journal() -> None:
    out = Transcript(terminal=True, window=8, head_cap=6)
    for chunk in (b"abcd", b"efgh", b"ijkl" * 4):
        out.append(chunk)
    assert bytes(out.head) == b"abcdef" and out.total == 24
    assert out.release_head() == b"abcdef"
    out.append(b"more")
    assert out.head == bytearray() and out.release_head() == b""  # handed over once, then not kept
    assert Transcript(terminal=False).head_cap == 0


def test_lost_bytes_are_said_where_they_were() -> None:
    out = Transcript(terminal=False)
    out.append(b"before\n")
    out.note_lost(0, "stdout")
    out.note_lost(1234, "stderr")
    out.append(b"after\n")
    assert out.lost == 1234
    assert out.read(0, final=False).text == (
        "before\n\n[ccw: 1234 bytes of stderr lost: more than one report carries]\nafter\n")
