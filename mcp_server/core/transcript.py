"""An interactive exec's output as its reader sees it: a bounded window of bytes, read by cursor.

The output of a run that an agent drives (``capsule_exec`` with ``interactive``,
capsules/console.py) is one stream of bytes, numbered from 0 as it arrived: a
terminal's output as the pty gave it, or, on pipes, each progress report's stdout then
its stderr (the helper reports every 100 ms, so the two streams' order is kept to that
grain).  A read names where to start (its ``cursor``; by default where the last read
ended) and gets the text from there to what has arrived, and the cursor to start the
next read at.

- **Bounded.**  The window keeps at least the newest ``WINDOW`` bytes (it is trimmed in
  steps of a quarter); a read that starts before them gets what is kept, after a line
  saying how many bytes it missed (``skipped``).  A terminal run also keeps its first
  ``head_cap`` bytes, which the journal records as its stdout.
- **Whole characters and sequences.**  A read of a run still going stops before a UTF-8
  character or (on a terminal) an escape sequence that has not all arrived
  (core/terminal_text.py ``incomplete_tail``), and the next read starts there.  Once the
  run has ended, everything is shown.
- **Terminal text.**  A terminal's output is shown as the screen would show it
  (``terminal_text.visible``); a pipe's is its bytes as UTF-8, undecodable bytes replaced,
  as an exec's stdout is.
- **Gaps.**  Bytes the helper could not deliver (more than one report carries) are not
  in the stream; a line saying how many were lost stands in their place
  (``note_lost``), so the reader sees where.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp_server.core.terminal_text import incomplete_tail, visible
from sandbox.errors import CcwError

WINDOW = 1 << 20  # bytes of the newest output kept for reads


@dataclass(frozen=True)
class Reading:
    """One read: the text from ``start``, and the cursor the next read starts at."""

    text: str
    start: int  # the offset the text starts at (after the asked cursor if bytes were dropped)
    cursor: int  # the offset after the text
    skipped: int  # bytes between the asked cursor and ``start``: older than the window


class Transcript:
    """The output bytes of one run: the newest ``window`` of them, and the first ``head_cap``."""

    def __init__(self, terminal: bool, window: int = WINDOW, head_cap: int = 0) -> None:
        self.terminal = terminal
        self.window = window
        self.head_cap = head_cap
        self.head = bytearray()  # the first head_cap bytes
        self.total = 0  # bytes that arrived (offsets run from 0 to here)
        self.lost = 0  # bytes the helper could not deliver (a line stands in for them)
        self._kept = bytearray()
        self._kept_from = 0  # the offset of _kept[0]

    @property
    def kept_from(self) -> int:
        """The oldest offset a read can still start at."""
        return self._kept_from

    def append(self, chunk: bytes) -> None:
        """Add output that arrived; the oldest bytes beyond the window are let go."""
        if not chunk:
            return
        if len(self.head) < self.head_cap:
            self.head += chunk[: self.head_cap - len(self.head)]
        self._kept += chunk
        self.total += len(chunk)
        excess = len(self._kept) - self.window
        if excess > self.window // 4:  # trimmed in steps, not at every byte
            del self._kept[:excess]
            self._kept_from += excess

    def release_head(self) -> bytes:
        """The first ``head_cap`` bytes, handed over once (the journal's): kept no longer."""
        head, self.head, self.head_cap = bytes(self.head), bytearray(), 0
        return head

    def note_lost(self, count: int, stream: str) -> None:
        """Say, in the stream, that ``count`` bytes of ``stream`` never arrived."""
        if count > 0:
            self.lost += count
            self.append(f"\n[ccw: {count} bytes of {stream} lost: more than one report carries]\n".encode())

    def check(self, cursor: int) -> None:
        """INVALID_ARGUMENT unless ``cursor`` is an offset of the output so far."""
        if not 0 <= cursor <= self.total:
            raise CcwError("INVALID_ARGUMENT", f"cursor {cursor} is outside the run's output (0 to {self.total}); "
                           "pass a cursor an answer gave, or none to read on from the last read",
                           {"cursor": cursor, "total": self.total})

    def read(self, cursor: int, final: bool) -> Reading:
        """The text from ``cursor`` to what has arrived (``final``: the run has ended, show all)."""
        self.check(cursor)
        start = max(cursor, self._kept_from)
        data = bytes(self._kept[start - self._kept_from :])
        if not final:
            data = data[: len(data) - incomplete_tail(data, escapes=self.terminal)]
        text = data.decode("utf-8", "replace")
        text = visible(text) if self.terminal else text
        if start > cursor:
            text = f"[ccw: {start - cursor} bytes of output before this are no longer kept]\n" + text
        return Reading(text, start, start + len(data), start - cursor)
