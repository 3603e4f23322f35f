"""mcp_server/core/terminal_text.py: what a terminal would show of a program's output, and how
much of a chunk's end must wait for the next one."""

from __future__ import annotations

import random

import pytest

from mcp_server.core.terminal_text import HOLD_MAX, incomplete_tail, visible


@pytest.mark.parametrize(("raw", "shown"), [
    # What a pty gives: CR LF for every newline.
    ("one\r\ntwo\r\n", "one\ntwo\n"),
    # Python's REPL under readline: bracketed paste turned on at each prompt, off after each line.
    ("\x1b[?2004h>>> x = 6*7\r\n\x1b[?2004l\r\x1b[?2004h>>> ", ">>> x = 6*7\n>>> "),
    # Colours and resets around words.
    ("\x1b[1;31mFAILED\x1b[0m test_a \x1b[32mok\x1b[m", "FAILED test_a ok"),
    # A progress bar redrawn with CR: only its last state is on the line.
    ("10%\r20%\r100%\r\ndone\r\n", "100%\ndone\n"),
    # A shorter text after CR overwrites only the start of the line, as on a screen.
    ("abcdef\rXY", "XYcdef"),
    # A dumb terminal's "clear line" (git's): the blanks a finished line ends with show nothing;
    # the line being written keeps its own (a prompt).
    ("hint: waiting\r" + " " * 79 + "\rSuccessfully rebased.\r\n", "Successfully rebased.\n"),
    ("padded   \r\n>>> ", "padded\n>>> "),
    # Backspace moves left; the echo of an erased character is BS SP BS.
    ("ab\b\bAB", "AB"),
    ("abc\b \b", "ab "),
    ("\b\bx", "x"),
    # Erase in line: to its end (default), from its start, all of it.
    ("abcdef\r\x1b[3C\x1b[K", "abc"),
    ("abcdef\x1b[3D\x1b[1K", "    ef"),
    ("abcdef\x1b[2Kxy", "      xy"),
    ("abcdef\x1b[2K\r\n", "\n"),
    # Cursor to a column, delete and insert characters (readline's line editing).
    ("abcdef\x1b[2GZ", "aZcdef"),
    ("abcdef\r\x1b[2C\x1b[2P", "abef"),
    ("abef\r\x1b[2C\x1b[2@cd", "abcdef"),
    # Moving right past the end leaves blanks, as a screen shows them.
    ("a\x1b[3Cb", "a   b"),
    # OSC: a window title ended by BEL or by ST, a hyperlink around its text.
    ("\x1b]0;user@host: ~\x07$ ", "$ "),
    ("\x1b]2;title\x1b\\after", "after"),
    ("\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\", "link"),
    # DCS, APC, PM, SOS strings.
    ("a\x1bPq#0;2;0;0;0#0~~\x1b\\b", "ab"),
    ("a\x1b_apc\x1b\\b\x1b^pm\x1b\\c\x1bXsos\x1b\\d", "abcd"),
    # Charset selects and other nF escapes; two-byte escapes (save/restore cursor, keypad modes).
    ("\x1b(B\x1b)0\x1b#8text\x1b%G", "text"),
    ("\x1b7saved\x1b8\x1b=\x1b>\x1bM\x1bc", "saved"),
    # Private CSI modes (cursor hidden/shown), scroll regions, screen erases, absolute moves: dropped.
    ("\x1b[?25l\x1b[1;24r\x1b[2J\x1b[Hscreen\x1b[?25h", "screen"),
    # Absolute moves (CUP), as vim sends them on a dumb terminal (found in a developer's trial of
    # git rebase -i: an indented line lost its indent, lines ran into one another): its column is
    # applied, and a move to another row than the last one named (newlines counted) ends the line.
    ("\x1b[50;1H\"todo\" 34L\x1b[1;1Hpick 1 c1\r\n#\x1b[2;11Hcommit's log\r\n~" + " " * 20 + "\x1b[4;1H~",
     "\"todo\" 34L\npick 1 c1\n#         commit's log\n~\n~"),
    ("#\x1b[2;11Hcreate", "#         create"),  # the row not known yet: the same line
    ("\x1b[10;1H50%\x1b[10;1H60%\x1b[10f70%", "70%"),  # redrawn in place
    ("\x1b[3;1Hsquash c3\x1b[50;12H3,1", "squash c3\n           3,1"),
    # 8-bit C1 forms: CSI and OSC.
    ("a\x9b31mb\x9d0;t\x07c", "abc"),
    # Other controls: BEL, NUL, DEL, FF, VT, a stray ESC and stray C1 controls are dropped; tabs stay.
    ("\x07a\x00b\x7fc\x0cd\x0be\x1b\x01f\x85g", "abcdefg"),
    ("col1\tcol2\r\n", "col1\tcol2\n"),
    # A sequence cut off at the very end (a run that has ended mid-sequence) is dropped.
    ("text\x1b[3", "text"),
    ("text\x1b]0;never ended", "text"),
    ("text\x1b", "text"),
    # Plain text and non-ASCII pass untouched.
    ("héllo wörld ✓ 中文", "héllo wörld ✓ 中文"),
    ("", ""),
])
def test_visible(raw: str, shown: str) -> None:
    assert visible(raw) == shown


def test_visible_leaves_no_control_character_in_noise() -> None:
    rng = random.Random(36)
    alphabet = "ab\x1b[]()0;?PX^_\\\x07\r\n\b\t\x9b\x9d\x9c7mK"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
        shown = visible(text)
        assert not any((ord(ch) < 0x20 and ch not in "\t\n") or 0x7F <= ord(ch) < 0xA0 for ch in shown), (text, shown)


@pytest.mark.parametrize(("data", "held"), [
    (b"", 0),
    (b"plain", 0),
    (b"done\r\n", 0),
    # Escape sequences not yet finished are held from their ESC.
    (b"abc\x1b", 1),
    (b"abc\x1b[", 2),
    (b"abc\x1b[?20", 5),
    (b"abc\x1b(", 2),
    (b"abc\x1b]0;a title", 11),
    (b"abc\x1b]0;a title\x1b", 12),  # the ESC of its ST has come, not its backslash
    (b"x\xc2\x9b3", 3),  # a C1 CSI in UTF-8, then a parameter
    # Whole ones are not.
    (b"abc\x1b[31m", 0),
    (b"abc\x1b[31mred", 0),
    (b"abc\x1b]0;t\x07", 0),
    (b"abc\x1b]0;t\x1b\\", 0),
    (b"abc\x1b(B", 0),
    (b"abc\x1b7", 0),
    # A UTF-8 character cut off: its first bytes are held.
    (b"caf\xc3", 1),
    (b"\xe2\x9c", 2),
    (b"\xf0\x9f\x98", 3),
    (b"caf\xc3\xa9", 0),
    ("✓".encode(), 0),
    # A sequence after a cut character in a CJK text is found by its byte offset.
    ("蛋".encode() + b"\x1b[1", 3),
])
def test_incomplete_tail(data: bytes, held: int) -> None:
    assert incomplete_tail(data) == held


def test_without_escapes_only_characters_are_held() -> None:
    assert incomplete_tail(b"abc\x1b[3", escapes=False) == 0
    assert incomplete_tail(b"abc\xe2\x9c", escapes=False) == 2


def test_a_string_longer_than_the_hold_is_let_go() -> None:
    endless = b"\x1b]0;" + b"t" * (HOLD_MAX + 10)
    assert incomplete_tail(endless) == 0
    assert incomplete_tail(b"\x1b]0;" + b"t" * (HOLD_MAX - 10)) == HOLD_MAX - 6


def test_split_anywhere_shows_what_the_whole_shows() -> None:
    """A stream read in two parts, each shown up to its incomplete tail, shows what it shows whole."""
    stream = "\x1b[?2004h>>> \x1b]0;title\x07print('✓')\r\n\x1b[1m✓\x1b[0m\r\n\x1b[?2004l\r".encode()
    whole = visible(stream.decode())
    for cut in range(len(stream) + 1):
        first = stream[:cut]
        kept = len(first) - incomplete_tail(first)
        shown = visible(stream[:kept].decode()) + "\x00" + visible(stream[kept:].decode())
        assert shown.replace("\x00", "") == whole, cut
