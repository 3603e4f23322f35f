"""mcp_server/cli/interactive.py without a front end: what ``ccw capsule exec --interactive``
refuses to go with, and our terminal's mode under --tty (each key at once, no echo here, output
processing kept) restored on the way out."""

from __future__ import annotations

import os
import termios
from pathlib import Path

import pytest
import trio

from mcp_server.cli import interactive, main
from mcp_server.cli.interactive import Keys
from mcp_server.config import Config
from sandbox.errors import CcwError


@pytest.mark.parametrize(("extra", "said"), [(["--stdin-file", "-"], "--stdin-file"), (["--json"], "--json")])
def test_options_an_interactive_run_cannot_take_are_refused(extra: list[str], said: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--state-dir", str(tmp_path), "--no-autostart", "capsule", "exec", "--interactive", *extra,
              "cap_0000000000000_00000000", "--", "true"])
    assert said in str(refused.value.code), refused.value.code


def test_a_command_is_needed(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--state-dir", str(tmp_path), "--no-autostart", "capsule", "exec", "--tty", "cap_0000000000000_00000000"])
    assert "give the command after --" in str(refused.value.code)


def test_under_tty_our_terminal_passes_each_key_unechoed_and_is_restored() -> None:
    master, slave = os.openpty()
    try:
        before = termios.tcgetattr(slave)
        with Keys(slave, raw=True):
            during = termios.tcgetattr(slave)
        after = termios.tcgetattr(slave)
    finally:
        os.close(master)
        os.close(slave)
    lflag = during[3]
    assert not lflag & (termios.ICANON | termios.ECHO | termios.ISIG)  # ^C and ^D go on as bytes
    assert during[1] & termios.OPOST  # a printed "\n" still ends the line
    assert before[3] & termios.ICANON and after == before


def test_without_tty_or_a_terminal_nothing_changes() -> None:
    read_end, write_end = os.pipe()
    try:
        with Keys(read_end, raw=True) as keys:  # a pipe: no terminal to set
            assert keys.fd == read_end
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_refused_keystroke_prints_the_details_its_error_points_at(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # What the agent's tool error shows, a person typing into the run reads too.
    calls: list[dict[str, object]] = []

    async def call_tool(config: object, name: str, args: dict[str, object]) -> dict[str, object]:
        calls.append(args)
        if "input" in args:
            raise CcwError("INVALID_ARGUMENT", "input refused; see details.problems",
                           {"problems": ["input: more than the run takes at once"]})
        return {}

    monkeypatch.setattr(interactive.frontclient, "call_tool", call_tool)
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"hello\n")
        trio.run(interactive._type, Config(), "run_0123", read_end)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert calls == [{"run_id": "run_0123", "wait_ms": 0, "input": "hello\n"}, {"run_id": "run_0123", "cancel": True}]
    assert capsys.readouterr().err.splitlines() == ["ccw: INVALID_ARGUMENT: input refused; see details.problems",
                                                    "details.problems:",
                                                    "  input: more than the run takes at once"]
