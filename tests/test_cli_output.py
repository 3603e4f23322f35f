"""How the ``ccw`` command writes an exec's output as it comes (mcp_server/cli/output.py ``Echo``):
each stream to ours, each byte once, whatever the reports overlap or drop, and the rest from
the result; the progress line erased before output and not drawn over an unended line."""

from __future__ import annotations

import base64
import io
from typing import Any

from mcp_server.capsules.exec import output_chunks
from mcp_server.cli.exec_report import show_exec
from mcp_server.cli.output import Echo, Progress
from sandbox.replies import ExecProgress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise OSError("no descriptor")


def _chunk(at: int, data: bytes) -> dict[str, Any]:
    return {"at": at, "data": base64.b64encode(data).decode()}


def _echo() -> tuple[Echo, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return Echo({"stdout": out, "stderr": err}), out, err


def _result(stdout: str, stderr: str = "") -> dict[str, Any]:
    return {"stdout": stdout, "stderr": stderr, "truncated": {"stdout": False, "stderr": False},
            "exit_code": 0, "signal": None, "timed_out": False}


def test_each_stream_goes_to_its_own_and_overlaps_print_once() -> None:
    echo, out, err = _echo()
    echo.feed({"stdout": _chunk(0, b"first\n"), "stderr": _chunk(0, b"warn\n")})
    assert (out.getvalue(), err.getvalue()) == ("first\n", "warn\n")
    echo.feed({"stdout": _chunk(3, b"st\nsecond\n")})  # a report that repeats bytes already printed
    echo.feed({"stdout": _chunk(6, b"")})
    assert out.getvalue() == "first\nsecond\n"
    assert echo.rest("stdout", "first\nsecond\nthird\n") == "third\n"
    assert echo.rest("stderr", "warn\n") == ""


def test_a_character_split_between_reports_is_printed_whole_once() -> None:
    echo, out, _ = _echo()
    text = "é日🙂\n"
    data = text.encode()
    for at in range(len(data)):  # one byte a report
        echo.feed({"stdout": _chunk(at, data[at:at + 1])})
        assert text.startswith(out.getvalue())
    assert out.getvalue() == text and echo.rest("stdout", text) == ""


def test_bytes_dropped_between_reports_end_the_streams_printing_and_the_result_gives_the_rest() -> None:
    echo, out, err = _echo()
    echo.feed({"stdout": _chunk(0, b"one\n")})
    echo.feed({"stdout": _chunk(100, b"far on\n"), "stderr": _chunk(0, b"e\n")})  # 96 bytes never came
    echo.feed({"stdout": _chunk(107, b"later\n")})
    assert out.getvalue() == "one\n" and err.getvalue() == "e\n"
    whole = "one\n" + "x" * 96 + "far on\nlater\n"
    assert echo.rest("stdout", whole) == whole[len("one\n"):]


def test_output_past_the_capture_is_printed_and_nothing_after_it() -> None:
    echo, out, _ = _echo()
    echo.feed({"stdout": _chunk(0, b"abcdef")})
    assert out.getvalue() == "abcdef" and echo.rest("stdout", "abc") == ""  # the result kept the first 3 bytes only


def test_undecodable_bytes_print_as_the_result_decodes_them() -> None:
    echo, out, _ = _echo()
    data = b"ok \xff\xfe \xe2\x82"  # two bad bytes, then a character cut short
    echo.feed({"stdout": _chunk(0, data)})
    whole = data.decode("utf-8", "replace")
    assert whole.startswith(out.getvalue())
    assert out.getvalue() + echo.rest("stdout", whole) == whole


def test_the_front_ends_chunks_are_what_echo_reads() -> None:
    report = ExecProgress(1000, 11, 3, b"second\n", b"w\n")  # a streaming report: what came since the last
    chunks = output_chunks(report)
    assert chunks == {"stdout": _chunk(4, b"second\n"), "stderr": _chunk(1, b"w\n")}
    assert output_chunks(ExecProgress(1000, 11, 3, b"", b"")) == {}
    echo, out, _ = _echo()
    echo.feed({"stdout": _chunk(0, b"one\n")})
    echo.feed(chunks)
    assert out.getvalue() == "one\nsecond\n"


def test_the_progress_line_is_erased_before_output_and_not_drawn_over_an_unended_line() -> None:
    terminal = _Terminal()
    echo = Echo({"stdout": terminal, "stderr": terminal})
    progress = Progress("exec", stream=terminal, echo=echo)
    progress.enabled = True
    progress.draw(0)
    progress.update(1.0, None, "running 1 s", {"stdout": _chunk(0, b"Password: ")})
    assert terminal.getvalue().endswith("\r\x1b[KPassword: ")
    progress.draw(1)
    assert terminal.getvalue().endswith("Password: ")  # not drawn over the prompt
    progress.update(2.0, None, None, {"stdout": _chunk(10, b"ok\n")})
    progress.draw(2)
    after = terminal.getvalue().split("Password: ok\n")[1]
    assert after.startswith("\r\x1b[K") and " exec " in after  # a line ended: drawn again below it


def test_exec_prints_only_what_was_not_printed_as_it_came(capsys: Any) -> None:
    echo = Echo()
    echo.feed({"stdout": _chunk(0, b"first\n")})
    assert show_exec(_result("first\nsecond\n", "err\n"), False, False, echo) == 0
    printed = capsys.readouterr()
    assert printed.out == "first\nsecond\n" and printed.err == "err\n"
