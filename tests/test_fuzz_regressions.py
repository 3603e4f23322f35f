"""Inputs the atheris targets (tests/fuzz/targets.py) found, kept as plain regression tests."""

from __future__ import annotations

from mcp_server.transports.framing import LineSplitter, Oversized


def test_oversized_head_does_not_depend_on_chunking() -> None:
    # With a limit below HEAD_SCAN, the head of a line fed whole held the whole line, but
    # fed in pieces only the bytes up to the piece that crossed the limit.
    line = b'{"jsonrpc":"2.0","method":"m","id":7,"params":"' + b"x" * 40 + b'"}'
    whole = LineSplitter(max_frame=16).feed(line + b"\n")
    pieces = LineSplitter(max_frame=16)
    chunked = [event for at in range(0, len(line) + 1, 5) for event in pieces.feed((line + b"\n")[at:at + 5])]
    assert whole == chunked == [Oversized(line, len(line))]
