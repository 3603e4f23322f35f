"""Interactive runs driven over MCP (issue 36), through a real ccw-mcp and its helper.

An SDK client over stdio, as an agent's: ``capsule_exec`` with ``interactive`` (or
``tty``) answers with a run id and the command's first output; ``capsule_run`` types
into it and reads back what it printed since the last read.

- A Python REPL on pipes, fed ``x = 6*7`` and ``print(x)`` with a read between, then end
  of file: it exits 0, its journal row's stdin is both lines, and a witness of the
  capsule replays with the same exit and output (the typed lines fed as its stdin).
- The same REPL on a pseudo-terminal: its prompt is shown, and no escape code is.
- ``git rebase -i`` in a real repository, whose sequence editor asks on the terminal
  (/dev/tty) what to do with each commit; the answers come through ``input``, and the
  history afterwards is what they said.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import trio
from mcp import Client

from mcp_server.journal import Journal
from mcp_server.state import State
from tests.support.interactive import call, git_repository, until
from tests.support.mcp_process import stdio_client
from tests.support.workspaces import make_workspace


def _client(tmp_path: Path) -> Client:
    return stdio_client(tmp_path, CCW_TOOLSETS="capsule,witness")


def _exec_rows(tmp_path: Path, capsule_id: str) -> list[dict[str, Any]]:
    return Journal(State(tmp_path / "state")).execs(capsule_id)


def test_a_python_repl_fed_two_lines_and_read_back_in_between(tmp_path: Path, root_required: None) -> None:
    ws = make_workspace(tmp_path / "ws", {"README": "repl\n"})

    async def scenario() -> dict[str, Any]:
        async with _client(tmp_path) as client:
            cap = (await call(client, "capsule_create", {"workspace": str(ws)}))["capsule_id"]
            started = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": ["python3", "-i", "-q"],
                                                           "interactive": True})
            prompt = await until(client, started, ">>> ")
            assigned = await call(client, "capsule_run", {"run_id": started["run_id"], "input": "x = 6*7\n"})
            printed = await call(client, "capsule_run", {"run_id": started["run_id"], "input": "print(x)\n"})
            printed["output"] = await until(client, printed, "42\n>>> ")
            ended = await call(client, "capsule_run", {"run_id": started["run_id"], "eof": True, "wait_ms": 20_000})
            witness = await call(client, "capsule_witness", {"capsule_id": cap})
            replay = await call(client, "capsule_replay", {"path": witness["path"]})
            return {"cap": cap, "started": started, "prompt": prompt, "assigned": assigned, "printed": printed,
                    "ended": ended, "replay": replay}

    seen = trio.run(scenario)
    assert seen["started"]["status"] == "running" and seen["started"]["run_id"].startswith("run_")
    assert seen["prompt"] == ">>> "
    assert seen["assigned"]["status"] == "running" and "42" not in seen["assigned"]["output"]
    assert seen["printed"]["status"] == "running" and seen["printed"]["output"].startswith("42\n")
    ended = seen["ended"]
    assert (ended["status"], ended["exit_code"], ended["signal"]) == ("finished", 0, None)
    assert ended["stdout"] == "42\n" and ended["stderr"].count(">>> ") == 3
    [row] = _exec_rows(tmp_path, seen["cap"])
    assert base64.b64decode(row["stdin_b64"]) == b"x = 6*7\nprint(x)\n" and not row["terminal"]
    replay = seen["replay"]
    assert replay["replay_ok"] is True, replay
    assert replay["output_identical"] is True, replay  # the typed lines, fed at once, give the same output


def test_a_python_repl_on_a_terminal_shows_its_prompt_without_escape_codes(tmp_path: Path,
                                                                            root_required: None) -> None:
    ws = make_workspace(tmp_path / "ws", {"README": "repl\n"})

    async def scenario() -> dict[str, Any]:
        async with _client(tmp_path) as client:
            cap = (await call(client, "capsule_create", {"workspace": str(ws)}))["capsule_id"]
            started = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": ["python3", "-q"], "tty": True})
            run_id = started["run_id"]
            prompt = await until(client, started, ">>> ")
            assigned = await call(client, "capsule_run", {"run_id": run_id, "input": "x = 6*7\n"})
            printed = await call(client, "capsule_run", {"run_id": run_id, "input": "print(x)\n"})
            printed["output"] = await until(client, printed, "42\n>>> ")
            ended = await call(client, "capsule_run", {"run_id": run_id, "eof": True, "wait_ms": 20_000})
            return {"cap": cap, "prompt": prompt, "assigned": assigned, "printed": printed, "ended": ended}

    seen = trio.run(scenario)
    assert seen["prompt"].endswith(">>> ")
    assert "x = 6*7" in seen["assigned"]["output"]  # the terminal's echo
    assert "42\n" in seen["printed"]["output"] and seen["printed"]["output"].endswith(">>> ")
    for answer in (seen["prompt"], seen["assigned"]["output"], seen["printed"]["output"], seen["ended"]["stdout"]):
        assert "\x1b" not in answer and "\r" not in answer, repr(answer)
    ended = seen["ended"]
    assert (ended["status"], ended["exit_code"]) == ("finished", 0)
    [row] = _exec_rows(tmp_path, seen["cap"])
    assert base64.b64decode(row["stdin_b64"]) == b"x = 6*7\nprint(x)\n" and not row["terminal"]
    assert row["stdout_bytes"] >= len(ended["stdout"]) > 0


def test_git_rebase_interactive_with_an_editor_answered_through_input(tmp_path: Path, root_required: None) -> None:
    ws = git_repository(tmp_path / "ws")
    rebase = ("GIT_SEQUENCE_EDITOR=./tools/seq-editor.sh "
              "git -c user.name=ccw -c user.email=ccw@example.invalid rebase -i HEAD~2")

    async def scenario() -> dict[str, Any]:
        async with _client(tmp_path) as client:
            cap = (await call(client, "capsule_create", {"workspace": str(ws)}))["capsule_id"]
            started = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", rebase],
                                                           "tty": True})
            run_id = started["run_id"]
            asked_second = await until(client, started, '"second"? ')
            asked_third = await call(client, "capsule_run", {"run_id": run_id, "input": "drop\n"})
            asked_third["output"] = await until(client, asked_third, '"third"? ')
            ended = await call(client, "capsule_run", {"run_id": run_id, "input": "pick\n", "wait_ms": 20_000})
            log = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": ["git", "log", "--format=%s"]})
            files = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": ["ls"]})
            return {"cap": cap, "asked_second": asked_second, "asked_third": asked_third, "ended": ended,
                    "log": log, "files": files}

    seen = trio.run(scenario)
    assert seen["asked_second"].endswith('what to do with "second"? ')
    assert 'what to do with "third"? ' in seen["asked_third"]["output"]
    ended = seen["ended"]
    assert (ended["status"], ended["exit_code"]) == ("finished", 0), ended
    assert "Successfully rebased" in ended["stdout"] + ended["output"]
    assert seen["log"]["stdout"] == "third\nfirst\n"  # the second commit dropped, as answered
    assert seen["files"]["stdout"].split() == ["story.txt", "third.txt", "tools"]
    rebase_row = _exec_rows(tmp_path, seen["cap"])[0]
    assert base64.b64decode(rebase_row["stdin_b64"]) == b"drop\npick\n"
