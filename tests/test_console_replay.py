"""mcp_server/capsules/console.py: how an interactive run's input went in (``Console.record``),
and a replay typing it in those steps (``Console.replay``), on a real pseudo-terminal with a
real program on its slave (no jail: the console's side is all there is to see here).

- A program that prompts twice then reads to its end: each write is recorded after the
  output that preceded it (its prompt), and a replay of the record gives the program's
  terminal the same bytes in the same order, prompts, echo and ^D included.
- A step whose output count is never reached is typed once the output pauses.
- A command that ends without reading: the replay's remaining steps are dropped, not raised.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable

import pytest
import trio

from mcp_server.capsules import console as console_module
from mcp_server.capsules.console import Console
from mcp_server.capsules.exec import exec_request

PROMPTS = r"""
import sys
first = input("first? ")
second = input("second? ")
rest = sys.stdin.read()
print(f"got {first!r} {second!r} {rest!r}")
"""
ECHO_ONE = r"""
print("reading")
print("read", input())
"""
WAIT_S = 30.0  # the longest any one expected output may take (a loaded machine), never a timing check


async def _session(console: Console, script: str, driver: Callable[[], Awaitable[None]]) -> bytes:
    """``script`` run on the console's terminal while ``driver`` types; all it showed."""
    request = console.prepare(exec_request("cap_test", ["python3"]))
    assert request.tty_fd is not None
    async with console.attached(), trio.open_nursery() as nursery:
        nursery.start_soon(driver)
        process = await trio.lowlevel.open_process([sys.executable, "-c", script], stdin=request.tty_fd,
                                                   stdout=request.tty_fd, stderr=request.tty_fd)
        with trio.fail_after(WAIT_S):
            await process.wait()
        nursery.cancel_scope.cancel()
    return bytes(console.transcript.head)


async def _shown(console: Console, wanted: bytes) -> None:
    with trio.fail_after(WAIT_S):
        while wanted not in bytes(console.transcript.head):
            await console.read(trio.Event(), None, 1.0)


def _terminal() -> Console:
    console = Console(terminal=True)
    console.transcript.head_cap = 1 << 16  # the test reads what was shown from the head
    return console


def test_a_replay_types_each_step_after_the_output_it_followed() -> None:
    async def scenario() -> tuple[bytes, bytes, dict[str, object], bytes]:
        with _terminal() as recorded:
            async def person() -> None:
                await _shown(recorded, b"first? ")
                recorded.give(b"one\n")
                await _shown(recorded, b"second? ")
                recorded.give(b"two\nthree\n")
                await _shown(recorded, b"three\r\n")
                recorded.give(b"", eof=True)

            shown = await _session(recorded, PROMPTS, person)
            record, typed = recorded.record(), bytes(recorded.typed)
        with _terminal() as replayed:
            again = await _session(replayed, PROMPTS, lambda: replayed.replay(typed, record))
        return shown, again, record, typed

    shown, again, record, typed = trio.run(scenario)
    assert typed == b"one\ntwo\nthree\n"
    assert b"got 'one' 'two' 'three\\n'" in shown
    steps = record["steps"]
    assert isinstance(steps, list) and [length for _, length in steps] == [4, 10]
    (first, _), (second, _) = steps
    assert shown[:first].endswith(b"first? ") and shown[:second].endswith(b"second? ")
    assert isinstance(record["eof"], int) and shown[: record["eof"]].endswith(b"three\r\n")
    assert again == shown  # the same bytes: prompts, echo, the answer


def test_a_step_whose_output_never_comes_is_typed_once_output_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console_module, "REPLAY_PAUSE_S", 0.2)
    record = {"tty": True, "steps": [[10_000, 4]], "eof": None}  # more output than this program prints

    async def scenario() -> bytes:
        with _terminal() as replayed:
            return await _session(replayed, ECHO_ONE, lambda: replayed.replay(b"abc\n", record))

    assert b"read abc" in trio.run(scenario)


def test_steps_left_when_the_command_ends_are_dropped() -> None:
    record = {"tty": True, "steps": [[0, 2], [10_000, 2]], "eof": 20_000}

    async def scenario() -> bytes:
        with _terminal() as replayed:
            shown = await _session(replayed, 'print("bye")', lambda: replayed.replay(b"a\nb\n", record))
            with trio.fail_after(WAIT_S):
                await replayed.replay(b"a\nb\n", record)  # after the end: CONFLICT, taken as the end
            return shown

    assert b"bye" in trio.run(scenario)
