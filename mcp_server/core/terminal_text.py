"""What a terminal would show of a program's output: text without its control sequences.

An interactive exec on a pseudo-terminal (``capsule_exec`` with ``tty``) writes for a
screen, and the agent reading it is shown text.  Some facts about that output which
the rules here follow from:

- A pty's line discipline turns each ``\\n`` into ``\\r\\n`` (ONLCR), so a carriage
  return is in front of every newline; a lone one (a progress bar, ``\\r10%\\r20%``)
  moves the cursor back to the line's start, and what follows overwrites the line.
  A backspace moves it back one cell (the echo of an erased character is ``\\b \\b``).
- Escape sequences start with ESC (0x1b): CSI (``ESC [`` parameters, intermediates,
  one final byte: colours, cursor moves, erasing, modes such as bracketed paste), OSC
  (``ESC ]`` up to BEL or ``ESC \\``: window titles, hyperlinks), DCS, SOS, PM and APC
  strings (up to ``ESC \\``), charset selects and other nF escapes (``ESC ( B``), and
  two-byte escapes (``ESC 7``, ``ESC =``, ``ESC M``).  Their 8-bit C1 forms (U+009B for
  CSI) are rare in UTF-8 but are taken the same way.
- Of the CSI sequences, the ones that move within a line or erase in it change what the
  line shows (readline edits with them): CUF/CUB/CHA (``C``, ``D``, ``G``), EL (``K``),
  DCH and ICH (``P``, ``@``).  They are applied to the line; every other sequence
  (colours, moves between lines, screen erases, modes) is dropped, since a full-screen
  program's screen cannot be rebuilt from a stream of lines anyway.  Except the absolute
  move (CUP, ``H`` and ``f``), which vim sends even on a dumb terminal (the editor of
  ``git rebase -i``): one to another row than the last one named (newlines counted since)
  ends the line, as the text continues elsewhere; its column is applied.  Without it vim's
  indented lines lost their indent and its lines ran into one another.
- Output arrives in chunks that may end inside a sequence or inside a UTF-8 character;
  ``incomplete_tail`` says how many trailing bytes to keep for the next read, so no
  sequence is ever shown half stripped.

- A finished line's trailing blanks show nothing on a screen, and programs write many: a
  dumb terminal's "clear line" is a carriage return, a line of spaces and another
  carriage return (git's ``term_clear_line``).  They are dropped; the line being written
  keeps its own (a prompt's ``>>> ``).

Other C0 controls (BEL, NUL, ...) and DEL are dropped; tabs and newlines stay.  Pure: the
callers pass text in (mcp_server/core/transcript.py, for capsules/console.py).
"""

from __future__ import annotations

import collections
import re

_STRING_START = r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])"  # OSC, DCS, SOS, PM, APC
_WHOLE_SOURCE = (
    r"(?:\x1b\[|\x9b)(?P<params>[0-?]*)(?P<inter>[ -/]*)(?P<final>[@-~])"  # CSI
    rf"|{_STRING_START}.*?(?:\x07|\x1b\\|\x9c)"  # a string, up to BEL or ST
    r"|\x1b[ -/]+[0-~]"  # nF: charset selects (ESC ( B), ESC # 8, ESC % G
    r"|\x1b(?![\[\]PX^_])[0-~]"  # Fp, Fe, Fs: ESC 7, ESC =, ESC M, ESC c (not a CSI or string start)
)
_WHOLE = re.compile(_WHOLE_SOURCE, re.DOTALL)
# Every sequence, and one cut off at the end: a string never terminated (with all that
# follows it), or a CSI or other escape that lacks its final byte.
_SEQUENCE = re.compile(rf"{_WHOLE_SOURCE}|{_STRING_START}.*\Z|(?:\x1b\[|\x9b)[0-?]*[ -/]*\Z|\x1b[ -/]*\Z",
                       re.DOTALL)
# C0 controls other than BS, TAB, LF, CR; DEL; the C1 controls that introduce nothing.
_DROPPED = {code: None for code in (*range(0x08), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F, *range(0x80, 0xA0))}
_MOVES = re.compile(r"([\r\b\n])")
HOLD_MAX = 4096  # bytes of an unterminated sequence held back at most; longer ones are shown as cut


class _Line:
    """The line being written: its cells and the cursor's column."""

    def __init__(self) -> None:
        self.cells: list[str] = []
        self.col = 0
        self.row: int | None = None  # the row the last CUP named, plus the newlines since (None: not known)

    def put(self, text: str) -> None:
        for char in text:
            if self.col < len(self.cells):
                self.cells[self.col] = char
            else:
                self.cells.extend(" " * (self.col - len(self.cells)))
                self.cells.append(char)
            self.col += 1

    def csi(self, final: str, params: str) -> None:
        """Apply a CSI sequence that acts within the line; others change nothing here."""
        numbers = [int(p) if p.isdigit() else 0 for p in params.split(";")] if params else []
        n = numbers[0] if numbers else 0
        if final == "C":
            self.col += max(n, 1)
        elif final == "D":
            self.col = max(self.col - max(n, 1), 0)
        elif final == "G":
            self.col = max(n, 1) - 1
        elif final == "K":
            if n == 0:
                del self.cells[self.col:]
            elif n == 1:
                self.cells[: self.col + 1] = " " * min(self.col + 1, len(self.cells))
            elif n == 2:
                self.cells.clear()
        elif final == "P":
            del self.cells[self.col : self.col + max(n, 1)]
        elif final == "@" and self.col < len(self.cells):
            self.cells[self.col : self.col] = " " * max(n, 1)

    def text(self) -> str:
        return "".join(self.cells)


def visible(text: str) -> str:
    """``text`` as a terminal would show it, line by line: escape sequences removed (those that
    move or erase within a line applied), carriage returns and backspaces overwriting, other
    controls dropped."""
    lines: list[str] = []
    line = _Line()
    position = 0
    for match in _SEQUENCE.finditer(text):
        _plain(text[position : match.start()], line, lines)
        if match.group("final") in ("H", "f") and not match.group("inter"):
            _move_to(match.group("params"), line, lines)
        elif match.group("final") and not match.group("inter"):
            line.csi(match.group("final"), match.group("params"))
        position = match.end()
    _plain(text[position:], line, lines)
    return "\n".join([*lines, line.text()])


def _move_to(params: str, line: _Line, lines: list[str]) -> None:
    """A CUP to (row, column), 1-based, either omitted as 1: another row ends the line being written."""
    row, col = ([int(p) if p.isdigit() else 1 for p in params.split(";")] + [1, 1])[:2]
    if line.row is not None and row != line.row and line.cells:
        _newline(line, lines)
    line.row, line.col = row, max(col, 1) - 1


def _newline(line: _Line, lines: list[str]) -> None:
    lines.append(line.text().rstrip(" "))  # blanks at a line's end show nothing
    line.cells, line.col = [], 0
    if line.row is not None:
        line.row += 1


def _plain(text: str, line: _Line, lines: list[str]) -> None:
    """Write text with no escape sequence in it: printable runs into the line, CR, BS and LF as
    a terminal moves, the other controls dropped."""
    for piece in _MOVES.split(text.translate(_DROPPED)):
        if piece == "\n":
            _newline(line, lines)
        elif piece == "\r":
            line.col = 0
        elif piece == "\b":
            line.col = max(line.col - 1, 0)
        else:
            line.put(piece)


def incomplete_tail(data: bytes, escapes: bool = True) -> int:
    """How many bytes at the end of ``data`` are the start of something not yet whole: a UTF-8
    character cut off, or (``escapes``) an escape sequence not yet finished (at most
    ``HOLD_MAX`` bytes of one).  A reader shows ``data`` up to there and keeps the rest."""
    held = _cut_utf8(data)
    if escapes:
        window = data[-HOLD_MAX:]
        text = window.decode("utf-8", "surrogateescape")  # one character per byte it cannot decode
        for last in collections.deque(_SEQUENCE.finditer(text), maxlen=1):  # the last sequence, if any
            if last.end() == len(text) and _WHOLE.fullmatch(last.group()) is None:  # cut off
                held = max(held, len(window) - len(text[: last.start()].encode("utf-8", "surrogateescape")))
    return held


def _cut_utf8(data: bytes) -> int:
    """How many trailing bytes begin a UTF-8 character that has not all arrived (0 to 3)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): does its character reach past the end?
            need = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
            return back if need > back else 0
    return 0
