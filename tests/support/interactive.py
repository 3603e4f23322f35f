"""Driving interactive runs in end-to-end tests: over MCP, a tool call that must succeed and
reads of a run until its output holds what a test waits for; and a command on a terminal of
the test's own (``ccw capsule exec --tty`` as a person runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mcp import Client

from tests.support.shell_session import CCW, ROOT, TRAMPOLINE, ShellSession, ccw_env
from tests.support.workspaces import make_workspace

CALL_TIMEOUT_S = 30.0

# A sequence editor that asks, on the terminal, what to do with each commit of git's todo list.
SEQUENCE_EDITOR = r"""#!/bin/sh
todo="$1"
exec 3<>/dev/tty
: > "$todo.new"
while read -r action sha subject; do
    if [ "$action" = pick ]; then
        printf 'what to do with "%s"? ' "$subject" >&3
        read -r answer <&3
        action="$answer"
    fi
    echo "$action $sha $subject" >> "$todo.new"
done < "$todo"
mv "$todo.new" "$todo"
"""


async def call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """The structured result of ``tool``, which must not fail."""
    result = await client.call_tool(tool, args, read_timeout_seconds=CALL_TIMEOUT_S)
    assert not result.is_error, result
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def until(client: Client, answer: dict[str, Any], wanted: str, wait_ms: int = 3000) -> str:
    """The output of ``answer`` and, until it holds ``wanted``, of further reads of its run (a
    slow start, a busy machine: at most 10)."""
    seen = str(answer["output"])
    for _ in range(10):
        if wanted in seen or answer["status"] != "running":
            break
        answer = await call(client, "capsule_run", {"run_id": answer["run_id"], "wait_ms": wait_ms})
        seen += answer["output"]
    return seen



def git_repository(path: Path) -> Path:
    """A workspace at ``path`` that is a git repository of three commits (first, second, third),
    with ``tools/seq-editor.sh`` (``SEQUENCE_EDITOR``) in it."""
    ws = make_workspace(path, {"tools/seq-editor.sh": SEQUENCE_EDITOR, "story.txt": "first\n"})
    (ws / "tools" / "seq-editor.sh").chmod(0o755)

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=ws,
                       check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    for subject in ("second", "third"):
        (ws / f"{subject}.txt").write_text(f"{subject}\n")
        git("add", ".")
        git("commit", "-q", "-m", subject)
    # Packed, as most repositories are: git looks for a loose object with stat() alone, which
    # no trace sees, so a witness would not carry it; a pack it opens travels whole.
    git("repack", "-a", "-d", "-q")
    return ws


class OnATerminal(ShellSession):
    """``ccw ARGV...`` on a pty of ours, as shell_session.py runs ``ccw capsule shell``: ``send``
    types, ``expect`` waits for what the terminal shows, ``wait`` for the exit status."""

    def __init__(self, state: Path, *argv: str) -> None:
        # ShellSession's start, with another command: the rest of it is the same session.
        self.master, slave = os.openpty()
        self.resize(24, 80, fd=slave)
        self.process = subprocess.Popen([sys.executable, "-c", TRAMPOLINE, *CCW, *argv], stdin=slave, stdout=slave,
                                        stderr=slave, env=ccw_env(state), cwd=ROOT)
        os.close(slave)
        self.shown = b""
        self._unread = 0
