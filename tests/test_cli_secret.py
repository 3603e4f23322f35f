"""``ccw secret set|list|rm`` (mcp_server/cli/secret.py) through ``ccw``'s own entry point: every
source of a value (a prompt on a real terminal, in a ``ccw`` process of its own; stdin, a file, a
command), every listing and refusal, then a search of everything printed and every other file of
the state dir for the value's bytes."""

from __future__ import annotations

import base64
import io
import json
import os
import pty
import sys
from pathlib import Path

import pytest

from mcp_server.cli import main
from mcp_server.fs.secretstore import STORE_NAME, SecretStore

CANARY = b"CANARY-7f3a9c-never-print-me"
CCW = str(Path(sys.executable).with_name("ccw"))


class _Stdin:
    """What ``ccw`` reads as its stdin: bytes, on no terminal."""

    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)

    def isatty(self) -> bool:
        return False


def _ccw(state: Path, *args: str, stdin: bytes = b"") -> tuple[int, bytes, bytes]:
    """``ccw ARGS`` in this process (the command is slow to start on a busy machine): status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CCW_STATE_DIR", str(state))
        patch.setenv("CCW_LOG_LEVEL", "debug")
        patch.setattr(sys, "stdin", _Stdin(stdin))
        patch.setattr(sys, "stdout", out)
        patch.setattr(sys, "stderr", err)
        try:
            status = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            status = int(exc.code or 0)
    return status, out.getvalue().encode(), err.getvalue().encode()


def _on_terminal(state: Path, typed: bytes, *args: str) -> tuple[int, bytes]:
    """Run ``ccw ARGS`` on a new terminal, type ``typed`` at its prompt; its status and all it showed."""
    pid, master = pty.fork()
    if pid == 0:  # the child: a terminal is its stdin, stdout and controlling tty
        os.environ.update({"CCW_STATE_DIR": str(state)})
        try:
            os.execv(CCW, [CCW, *args])
        finally:
            os._exit(127)
    shown = b""
    while b"not shown" not in shown:
        shown += os.read(master, 1024)
    os.write(master, typed + b"\n")
    while True:
        try:
            chunk = os.read(master, 1024)
        except OSError:  # EIO: the child has gone and closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), shown


def test_every_source_and_verb_and_the_value_is_printed_nowhere(tmp_path: Path) -> None:
    state, printed = tmp_path / "state", []

    def run(*args: str, stdin: bytes = b"", status: int = 0) -> dict:  # type: ignore[type-arg]
        code, out, err = _ccw(state, *args, stdin=stdin)
        printed.append(out + err)
        assert code == status, err
        return json.loads(out) if "--json" in args and status == 0 else {}

    run("secret", "set", "FROM_STDIN", "--host", "api.example", "--stdin", stdin=CANARY + b"\n")
    value_file = tmp_path / "value"
    value_file.write_bytes(CANARY)
    run("secret", "set", "FROM_FILE", "--host", "git.example:8443", "--format", "basic-password",
        "--file", str(value_file))
    run("secret", "set", "FROM_COMMAND", "--host", "pypi.example", "--format", "query:key", "--command",
        f"cat {value_file}")
    status, shown = _on_terminal(state, CANARY, "secret", "set", "FROM_PROMPT", "--host", "m.example",
                                 "--header", "X-Api-Key")
    printed.append(shown)
    assert status == 0 and b"set FROM_PROMPT" in shown  # getpass turned echo off: the value was not shown
    listing = run("secret", "list", "--json")["secrets"]
    assert {s["name"]: s["source"] for s in listing} == {"FROM_STDIN": "stdin", "FROM_FILE": "file",
                                                         "FROM_COMMAND": "command", "FROM_PROMPT": "prompt"}
    assert {s["name"]: s["format"] for s in listing}["FROM_FILE"] == "basic-password"
    run("secret", "list")
    store = SecretStore(state)
    assert {store.value(n).reveal() for n in ("FROM_STDIN", "FROM_FILE", "FROM_COMMAND", "FROM_PROMPT")} == {CANARY}

    # Every refusal, some with the value in hand.
    run("secret", "set", "BAD", "--host", "*.example", "--stdin", stdin=CANARY, status=1)
    run("secret", "set", "BAD", "--host", "h.example", "--stdin", stdin=CANARY + b"\nX-Injected: 1", status=1)
    run("secret", "set", "BAD", "--host", "h.example", "--command", f"cat {value_file}; exit 3", status=1)
    run("secret", "set", "BAD", "--host", "h.example", "--stdin", status=1)
    run("secret", "set", "BAD", "--host", "h.example", stdin=CANARY, status=1)  # no terminal to prompt on
    run("secret", "set", "BAD", "--host", "h.example", "--stdin", "--file", str(value_file), status=2)
    run("secret", "rm", "NOPE", status=1)
    run("secret", "rm", "FROM_STDIN", "--json")
    assert [s.binding.name for s in store.secrets()] == ["FROM_COMMAND", "FROM_FILE", "FROM_PROMPT"]

    encoded = base64.b64encode(CANARY)
    for output in printed:
        assert CANARY not in output and encoded not in output
    assert (state / STORE_NAME).exists()
    for path in state.rglob("*"):
        if path.is_file() and path.name != STORE_NAME:
            assert CANARY not in path.read_bytes() and encoded not in path.read_bytes(), path
    assert CANARY not in (state / STORE_NAME).read_bytes()  # at rest in base64, mode 0600


@pytest.mark.parametrize("args", [["secret", "set", "N", "--host", "h.example", "--format", "nope", "--stdin"],
                                  ["secret", "set", "9N", "--host", "h.example", "--stdin"]])
def test_a_bad_binding_is_refused_and_nothing_is_stored(tmp_path: Path, args: list[str]) -> None:
    code, _, err = _ccw(tmp_path, *args, stdin=CANARY)
    assert code == 1 and b"INVALID_ARGUMENT" in err
    assert not (tmp_path / STORE_NAME).exists()
