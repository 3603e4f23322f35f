"""How the ``ccw`` command writes: JSON, colour only on a terminal, a progress line on stderr.

Colour follows the usual conventions: only when the stream is a terminal, never with
``--no-color``, ``NO_COLOR`` set (any value, no-color.org) or ``TERM=dumb``.  The
progress line (a spinner, the elapsed time and the last progress message a tool
reported) is drawn on stderr only when stderr is a terminal, and erased when the call
ends, so piped output and ``--json`` stay clean.

An exec's output is printed as it comes (``Echo``), on a terminal or not: a script or an
agent that pipes ``ccw capsule exec`` wants it as much as a person does.  Some facts it
follows from:

- **What comes.**  The command asks for it (``_meta["ccw/output"]``, mcp_server/caller.py)
  and each progress notification then carries what each stream wrote since the last, with
  the offset of its first byte (capsules/exec.py ``output_chunks``), about four times a
  second.  A report holds at most the newest 256 KiB of a stream: past that, bytes are
  dropped between reports and the offset says so.
- **Exactly once.**  A stream is printed up to the offset it has reached; a chunk that
  overlaps it gives only its new bytes; one past it (bytes dropped) ends that stream's
  printing, and its rest comes from the result, whose text is the stream's captured
  output (its first MiB) decoded whole.  Each stream is decoded as it comes, holding a
  character split between chunks, so what was printed is a prefix of that text, and the
  result's text past it is the rest.  Output past the capture cap that came in reports
  is printed (more than the result holds, never other bytes).
- **Beside the progress line.**  The line is erased before output is written, and not
  drawn while the output's last line is unended (a prompt, a progress bar): redrawing it
  would erase that line.
"""

from __future__ import annotations

import base64
import codecs
import json
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TextIO, TypeVar

from mcp_server.cli.toolwords import in_cli_words
from sandbox.errors import CcwError

# trio and outcome are imported by the coroutines below that use them: whoever awaits one
# runs trio already, and a command that calls nothing (``ccw --help``) loads neither
# (tests/test_cli_imports.py).

T = TypeVar("T")
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
TICK_S = 0.1

RESET = "\x1b[0m"
GREEN, RED, CYAN, BOLD, DIM = "\x1b[32m", "\x1b[31m", "\x1b[36m", "\x1b[1m", "\x1b[2m"


def use_color(stream: TextIO, no_color: bool = False) -> bool:
    """Whether to colour what goes to ``stream``."""
    if no_color or "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def paint(text: str, code: str, color: bool) -> str:
    """``text`` in the ANSI colour ``code`` when ``color``, else unchanged."""
    return f"{code}{text}{RESET}" if color and text else text


def color_diff(diff: str, color: bool) -> str:
    """A unified diff with git's colours: headers bold, hunks cyan, + green, - red."""
    if not color:
        return diff
    out = []
    for line in diff.splitlines(keepends=True):
        body, end = (line[:-1], "\n") if line.endswith("\n") else (line, "")
        if body.startswith(("+++", "---", "diff ", "new file", "deleted file", "old mode", "new mode", "index ")):
            out.append(paint(body, BOLD, True) + end)
        elif body.startswith("@@"):
            out.append(paint(body, CYAN, True) + end)
        elif body.startswith("+"):
            out.append(paint(body, GREEN, True) + end)
        elif body.startswith("-"):
            out.append(paint(body, RED, True) + end)
        else:
            out.append(line)
    return "".join(out)


_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
# Bidi controls (embeddings, overrides, isolates, marks): a terminal that does bidi (VTE's,
# Konsole) draws the text after one reordered, so a diff's line reads as other code than it
# is ("Trojan Source") and a file name as another name.  Right-to-left letters stay.
_BIDI_CONTROLS = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_CONTROLS.update({code: f"\\u{code:04x}" for code in _BIDI_CONTROLS})


def visible(text: str, keep_newlines: bool = False) -> str:
    """``text`` with its control characters written as ``\\xNN``: what a capsule named (a
    path, an argv, a host) must not drive the terminal it is shown on (escape sequences
    can move the cursor, rewrite earlier lines, set the window title)."""
    table = dict(_CONTROLS)
    if keep_newlines:
        table.pop(0x0A)
        table.pop(0x09)
    return text.translate(table)


# JSON escapes C0 controls itself, but with ensure_ascii=False leaves DEL and the C1
# controls as they are: U+009B is CSI to many terminals, so a capsule's file name could
# still drive the terminal that ``--json`` output lands on.  In JSON text they can only be
# inside strings, where \uXXXX is the same character.
_JSON_CONTROLS = {code: f"\\u{code:04x}" for code in (0x7F, *range(0x80, 0xA0))}


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one: "1 hunk", "2 files"."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def json_text(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON, keys sorted, non-ASCII text as itself but no control character raw."""
    return json.dumps(value, indent=indent, sort_keys=True, ensure_ascii=False).translate(_JSON_CONTROLS)


def print_json(value: Any, stream: TextIO | None = None) -> None:
    """One JSON document, keys sorted, on stdout (or ``stream``)."""
    stream = stream or sys.stdout
    stream.write(json_text(value, indent=2) + "\n")
    stream.flush()


# An error's message names the details it says to read as "see details.problems".
_POINTED = re.compile(r"\bdetails\.(\w+)")
SHOWN_DETAILS = 20  # entries of one pointed-at detail printed; --json has them all


def pointed_details(message: str, details: Mapping[str, Any]) -> list[str]:
    """The lines that show a person each field of an error's ``details`` its ``message`` points at
    ("see details.problems"): its name, then one entry a line (a list's items, a mapping's keys).
    Control characters are made visible: a witness's paths and blob names are its maker's."""
    lines = []
    for name in dict.fromkeys(_POINTED.findall(message)):
        if name not in details:
            continue
        value = details[name]
        if isinstance(value, Mapping):
            entries = [f"{key}: {_entry(item)}" for key, item in value.items()]
        else:
            entries = [_entry(item) for item in (value if isinstance(value, list) else [value])]
        lines.append(f"details.{name}:")
        lines += [f"  {visible(entry)}" for entry in entries[:SHOWN_DETAILS]]
        if len(entries) > SHOWN_DETAILS:
            lines.append(f"  ... and {len(entries) - SHOWN_DETAILS} more (--json shows them all)")
    return lines


def print_error(exc: CcwError, details: bool = True) -> None:
    """``ccw: CODE: message`` on stderr (in the CLI's words), then the details the message says
    to see ("see details.problems"), which a person has no other way to read."""
    print(f"ccw: {exc.code}: {in_cli_words(exc.message)}", file=sys.stderr)
    for line in pointed_details(exc.message, exc.details) if details else ():
        print(line, file=sys.stderr)


def _entry(value: Any) -> str:
    """One entry of a detail on one line: text as itself, a mapping as ``key: value, ...``, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return ", ".join(f"{key}: {_entry(item)}" for key, item in value.items())
    return json_text(value)


def one_line(message: str) -> str:
    """A progress message for a line redrawn in place: its first and last non-blank lines,
    control characters visible.  A run's report is a head line, then the command's last
    output lines: what the jail wrote, which must not reach the terminal raw (even when
    stdout went elsewhere), nor span lines."""
    lines = [line for line in message.splitlines() if line.strip()]
    return " · ".join(visible(line) for line in (lines[:1] + lines[-1:] if len(lines) > 1 else lines))


class Echo:
    """An exec's output printed as its progress notifications bring it, each stream to ours,
    each byte once (see the module's opening); ``rest`` gives what of the result is left."""

    def __init__(self, streams: Mapping[str, TextIO] | None = None) -> None:
        self.streams = dict(streams) if streams is not None else {"stdout": sys.stdout, "stderr": sys.stderr}
        self.reached = dict.fromkeys(self.streams, 0)  # bytes of each stream printed
        self.shown = dict.fromkeys(self.streams, 0)  # characters of its decoded text printed
        self.dropped: set[str] = set()  # streams that lost bytes between reports: their rest is the result's
        self.line_open = False  # the last output written to a terminal ended inside a line
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in self.streams}

    def feed(self, chunks: Mapping[str, Any]) -> None:
        """Print what ``chunks`` (a notification's ``_meta["ccw/output"]``) holds past what was printed."""
        for name, chunk in chunks.items():
            if name not in self.streams or name in self.dropped:
                continue
            at, data = int(chunk["at"]), base64.b64decode(chunk["data"])
            if at > self.reached[name]:
                self.dropped.add(name)
                continue
            data = data[self.reached[name] - at:]
            self.reached[name] += len(data)
            self._write(name, self._decoders[name].decode(data))

    def rest(self, name: str, text: str) -> str:
        """What of the result's ``text`` for stream ``name`` (its capture, decoded whole) is left to print."""
        return text[self.shown[name]:]

    def _write(self, name: str, text: str) -> None:
        if not text:
            return
        stream = self.streams[name]
        stream.write(text)
        stream.flush()
        self.shown[name] += len(text)
        isatty = getattr(stream, "isatty", None)
        if isatty and isatty():
            self.line_open = not text.endswith("\n")


class Progress:
    """The progress line's state: what is running, since when, the last message; an exec's
    output printed above it as it comes (``echo``)."""

    def __init__(self, label: str, stream: TextIO | None = None, echo: Echo | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = use_color(self.stream)  # same rule: a terminal that can redraw
        self.started = time.monotonic()
        self.message = ""
        self.fraction: float | None = None
        self.echo = echo
        self._drawn = False

    def update(self, progress: float, total: float | None, message: str | None,
               output: Mapping[str, Any] | None = None) -> None:
        """Record a progress report from the tool (drawn on the next tick); print the ``output`` it carried."""
        self.fraction = progress / total if total else None
        if message:
            self.message = one_line(message)
        if output and self.echo is not None:
            self.clear()
            self.echo.feed(output)

    def line(self, frame: int) -> str:
        """The text of the line for spinner frame ``frame``."""
        elapsed = time.monotonic() - self.started
        parts = [SPINNER[frame % len(SPINNER)], self.label, f"{elapsed:5.1f}s"]
        if self.fraction is not None:
            parts.append(f"{100 * min(self.fraction, 1.0):3.0f}%")
        if self.message:
            parts.append(self.message)
        return " ".join(parts)

    def draw(self, frame: int) -> None:
        """Redraw the line in place (terminal only; not over an unended line of output)."""
        if not self.enabled or (self.echo is not None and self.echo.line_open):
            return
        text = self.line(frame)
        width = os.get_terminal_size(self.stream.fileno()).columns if self._is_terminal() else 80
        self.stream.write("\r\x1b[K" + text[: max(width - 1, 10)])
        self.stream.flush()
        self._drawn = True

    def clear(self) -> None:
        """Erase the line."""
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def _is_terminal(self) -> bool:
        try:
            os.get_terminal_size(self.stream.fileno())
        except (OSError, ValueError):
            return False
        return True


async def run_with_progress(progress: Progress, call: Callable[[], Awaitable[T]]) -> T:
    """Await ``call()`` while drawing ``progress`` every tick; erase the line afterwards."""
    if not progress.enabled:
        return await call()

    async def tick() -> None:
        import trio

        frame = 0
        while True:
            progress.draw(frame)
            frame += 1
            await trio.sleep(TICK_S)

    try:
        return await beside(tick, call)
    finally:
        progress.clear()


async def beside(background: Callable[[], Awaitable[None]], call: Callable[[], Awaitable[T]]) -> T:
    """``call()``'s result while ``background()`` runs beside it (cancelled once ``call`` ends).

    ``call``'s exception leaves as itself: raised inside the nursery it would come out
    wrapped in an ExceptionGroup, which ``ccw``'s error handling does not take for a
    ``CcwError`` (a tool's refusal printed as a traceback)."""
    import outcome
    import trio

    result: list[outcome.Outcome[T]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(background)
        result.append(await outcome.acapture(call))
        nursery.cancel_scope.cancel()
    return result[0].unwrap()


EXIT_TIMEOUT = 124  # as timeout(1)


def exec_status(result: dict[str, Any]) -> int:
    """The exit status ``ccw capsule exec`` ends with, from the exec's result."""
    if result.get("timed_out"):
        return EXIT_TIMEOUT
    if result.get("exit_code") is not None:
        return int(result["exit_code"])
    name = result.get("signal") or ""
    try:
        return 128 + int(signal.Signals[name])
    except KeyError:
        return 1
