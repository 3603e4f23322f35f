"""Replays of interactive runs on a terminal (issue 36), through a real ccw-mcp and its helper.

A run started with ``tty`` is journaled with what was typed and in which steps (each
after how much output); its witness's replay makes a pseudo-terminal again, as the
recorded run had, and types each step once the replayed output has come as far.

- A Python REPL fed two lines and end of file on a terminal: the replay holds
  (``replay_ok``), and its output, prompts and echo included, is the recorded one's.
- ``git rebase -i HEAD~2`` whose sequence editor asks on /dev/tty what to do with each
  commit, answered through input: the replay asks again, gets the same answers from the
  record, and leaves the same history (the commits' dates fixed, so their hashes match).
- The journal row keeps the steps: the typed bytes, each after the output that preceded it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from mcp import Client

from mcp_server.journal import Journal
from mcp_server.state import State
from tests.support.interactive import call, git_repository, until
from tests.support.mcp_process import stdio_client
from tests.support.workspaces import make_workspace

GIT = "git -c user.name=ccw -c user.email=ccw@example.invalid"
# The dates the new commits (and reflog lines) get: a replay's are the same, and so are their hashes.
DATES = "GIT_COMMITTER_DATE=@1700000000 GIT_AUTHOR_DATE=@1700000000"


def _client(tmp_path: Path) -> Client:
    return stdio_client(tmp_path, CCW_TOOLSETS="capsule,witness")


def _console_of(tmp_path: Path, capsule_id: str, seq: int = 1) -> dict[str, Any]:
    [row] = [row for row in Journal(State(tmp_path / "state")).execs(capsule_id) if row["seq"] == seq]
    return dict(json.loads(row["console"]))


def test_a_python_repl_on_a_terminal_replays_on_one(tmp_path: Path, root_required: None) -> None:
    ws = make_workspace(tmp_path / "ws", {"README": "repl\n"})

    async def scenario() -> dict[str, Any]:
        async with _client(tmp_path) as client:
            cap = (await call(client, "capsule_create", {"workspace": str(ws)}))["capsule_id"]
            started = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": ["python3", "-q"], "tty": True})
            run_id = started["run_id"]
            await until(client, started, ">>> ")
            await call(client, "capsule_run", {"run_id": run_id, "input": "x = 6*7\n"})
            printed = await call(client, "capsule_run", {"run_id": run_id, "input": "print(x)\n"})
            await until(client, printed, "42\n>>> ")
            ended = await call(client, "capsule_run", {"run_id": run_id, "eof": True, "wait_ms": 20_000})
            witness = await call(client, "capsule_witness", {"capsule_id": cap})
            replay = await call(client, "capsule_replay", {"path": witness["path"]})
            return {"cap": cap, "ended": ended, "replay": replay}

    seen = trio.run(scenario)
    assert (seen["ended"]["status"], seen["ended"]["exit_code"]) == ("finished", 0)
    record = _console_of(tmp_path, seen["cap"])
    assert record["tty"] is True
    assert [length for _, length in record["steps"]] == [len("x = 6*7\n"), len("print(x)\n")]
    first, second = (after for after, _ in record["steps"])
    assert 0 < first < second < record["eof"]  # each typed after a prompt, the end after the last
    replay = seen["replay"]
    assert replay["replay_ok"] is True, replay
    assert replay["output_identical"] is True, replay  # prompts and echo where they were


def test_git_rebase_interactive_answered_on_the_terminal_replays(tmp_path: Path, root_required: None) -> None:
    ws = git_repository(tmp_path / "ws")
    # git checks that the work tree is clean with stat() alone, which no trace sees, so a witness
    # would not carry the files it did not open (witness_base.py): the command reads them first.
    rebase = (f"cat *.txt > /dev/null && {DATES} GIT_SEQUENCE_EDITOR=./tools/seq-editor.sh GIT_EDITOR=true "
              f"{GIT} rebase -i HEAD~2")

    async def scenario() -> dict[str, Any]:
        async with _client(tmp_path) as client:
            # The index records each file's inode and ctime: a rebuilt base's differ, and so does it.
            cap = (await call(client, "capsule_create", {"workspace": str(ws), "volatile": [".git/index"]}))
            cap_id = cap["capsule_id"]
            started = await call(client, "capsule_exec", {"capsule_id": cap_id, "cmd": ["sh", "-c", rebase],
                                                          "tty": True})
            run_id = started["run_id"]
            await until(client, started, '"second"? ')
            asked = await call(client, "capsule_run", {"run_id": run_id, "input": "drop\n"})
            await until(client, asked, '"third"? ')
            ended = await call(client, "capsule_run", {"run_id": run_id, "input": "pick\n", "wait_ms": 20_000})
            log = await call(client, "capsule_exec", {"capsule_id": cap_id, "cmd": ["git", "log", "--format=%s"]})
            witness = await call(client, "capsule_witness", {"capsule_id": cap_id})
            replay = await call(client, "capsule_replay", {"path": witness["path"]})
            return {"cap": cap_id, "ended": ended, "log": log, "replay": replay}

    seen = trio.run(scenario)
    assert (seen["ended"]["status"], seen["ended"]["exit_code"]) == ("finished", 0), seen["ended"]
    assert seen["log"]["stdout"] == "third\nfirst\n"
    record = _console_of(tmp_path, seen["cap"])
    assert [length for _, length in record["steps"]] == [len("drop\n"), len("pick\n")] and record["eof"] is None
    replay = seen["replay"]
    assert replay["replay_ok"] is True, replay
    assert replay["output_identical"] is True, replay
