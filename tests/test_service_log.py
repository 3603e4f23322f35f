"""capsules/service_log.py: a service's output as a bounded ring on disk, read by cursor."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_server.capsules import service_log
from mcp_server.capsules.service_log import LogRing


def test_a_reader_follows_by_cursor_and_sees_only_what_came_after(tmp_path: Path) -> None:
    ring = LogRing(tmp_path / "svc", "web", limit=1000)
    ring.append(b"one\ntwo\n")
    first = ring.read()
    assert (first.text, first.start, first.cursor, first.lost) == ("one\ntwo\n", 0, 8, 0)
    ring.append(b"three\n")
    after = ring.read(since=first.cursor)
    assert (after.text, after.start, after.cursor) == ("three\n", 8, 14)
    assert ring.read(since=after.cursor).text == ""
    assert ring.read(tail=2).text == "two\nthree\n"
    assert ring.read(tail=0).text == ""


def test_the_ring_keeps_about_its_limit_and_says_what_a_late_reader_lost(tmp_path: Path) -> None:
    ring = LogRing(tmp_path, "web", limit=100)
    for number in range(40):
        ring.append(f"line {number:02d}\n".encode())  # 8 bytes each: 320 in all
    kept = ring.read()
    assert kept.cursor == 320
    assert 50 <= len(kept.text) <= 100 and kept.text.endswith("line 39\n")
    assert kept.start == 320 - len(kept.text.encode())
    late = ring.read(since=0)
    assert late.lost == kept.start and late.text == kept.text
    # A new LogRing over the same files (a restarted front end) keeps the cursors.
    again = LogRing(tmp_path, "web", limit=100)
    assert again.read().cursor == 320 and again.read().text == kept.text
    again.remove()
    assert list(tmp_path.iterdir()) == []


def test_a_burst_larger_than_half_the_ring_keeps_its_end(tmp_path: Path) -> None:
    ring = LogRing(tmp_path, "web", limit=64)
    ring.append(b"x" * 100 + b"END\n")
    kept = ring.read()
    assert kept.cursor == 104 and kept.text.endswith("END\n") and len(kept.text) <= 32


def test_one_read_answers_at_most_read_max(tmp_path: Path) -> None:
    ring = LogRing(tmp_path, "web", limit=10_000)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service_log, "READ_MAX", 10)
        ring.append(b"0123456789abcdefghij")
        part = ring.read()
    assert part.text == "abcdefghij" and part.start == 10 and part.cursor == 20
