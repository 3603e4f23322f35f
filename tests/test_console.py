"""Interactive runs (mcp_server/capsules/console.py) through capsule_exec and capsule_run, with a
fake helper whose "jail" is a small REPL on the pipe or terminal the request carries.

The fake answers as the helper does: a piped run's output comes in streamed progress
reports every ``ROUND_S`` (and what came after the last one, in the reply only); a
terminal run writes to the pty slave it was sent.  The tool handlers run behind a real
Runtime (its runs, turns, journal), their arguments and answers checked against the
tools' schemas.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio

from mcp_server.capsules import console as console_module
from mcp_server.capsules.console import EOF_CHAR, INPUT_MAX, QUIET_S, TERM, Console
from mcp_server.capsules.exec import CANCELLED
from mcp_server.config import TOOLSETS, Config
from mcp_server.context import CallContext, Runtime
from mcp_server.journal import Journal
from mcp_server.state import State
from mcp_server.tools.registry import Registry
from sandbox.errors import CcwError
from sandbox.ops import CreateRequest, ExecRequest, ListRequest, OpRequest
from sandbox.replies import (
    CreateReply,
    ExecProgress,
    ExecReply,
    ListReply,
    OpReply,
    Touched,
    Truncated,
    Usage,
)
from sandbox.spec import CapsuleSpec

ROUND_S = 0.05  # the fake helper's report interval (the real one's is console.PROGRESS_MS, 0.1 s)
SLOW_GAP_S = 0.08  # between the two parts of a slow answer: more than a report apart, well within QUIET_S
REGISTRY = Registry.load(TOOLSETS)


def _reply(exit_code: int, stdout: bytes, stderr: bytes) -> ExecReply:
    return ExecReply(
        exit_code=exit_code, signal=None, timed_out=False, oom_killed=False, duration_ms=5, stdout=stdout,
        stderr=stderr, stdout_bytes=len(stdout), stderr_bytes=len(stderr), truncated=Truncated(False, False),
        usage=Usage(cpu_ms=1, rss_max_kb=2, rss_max_process_kb=2, io_read_kb=0, io_write_kb=0),
        usage_unavailable={}, usage_sources={"cpu_ms": "cgroup"}, disk=None,
        touched=Touched((), (), (), ()), touched_unavailable={},
    )


async def _repl(read: Callable[[], Awaitable[bytes]], say: Callable[[bytes], None], prompt: Callable[[], None]) -> int:
    """The jail's program: each line back in capitals; ``slow`` answers in two parts ``SLOW_GAP_S`` apart,
    ``sleep`` after 1 s; ``exit N`` says bye and exits N; end of file says eof and exits 0."""
    buffer = b""
    prompt()
    while True:
        chunk = await read()
        if not chunk:
            say(b"eof\n")
            return 0
        buffer += chunk
        while b"\n" in buffer:
            line, _, buffer = buffer.partition(b"\n")
            if line.startswith(b"exit "):
                say(b"bye\n")  # no report follows: it is in the reply only
                return int(line[5:])
            if line == b"slow":
                say(b"one\n")
                await trio.sleep(SLOW_GAP_S)
                say(b"two\n")
            elif line == b"sleep":
                await trio.sleep(1)
            else:
                say(line.upper() + b"\n")
            prompt()


class FakeHelper:
    """The helper as interactive runs use it; every exec request is kept."""

    def __init__(self) -> None:
        self.requests: list[ExecRequest] = []

    async def call(self, request: OpRequest, on_progress: Any = None) -> OpReply:
        if isinstance(request, CreateRequest):
            return CreateReply("cap_1", "/m/1", request.spec.workspace, "", "", {})
        if isinstance(request, ListRequest):
            return ListReply(())
        assert isinstance(request, ExecRequest), request
        self.requests.append(request)
        if request.stdio == "tty":
            return await self._terminal(request)
        if request.stdio == "stdin":
            return await self._piped(request, on_progress)
        await trio.sleep(1)
        return _reply(0, b"plain\n", b"")

    async def _piped(self, request: ExecRequest, on_progress: Any) -> ExecReply:
        assert request.tty_fd is not None
        stdin = request.tty_fd
        out, err, sent = bytearray(), bytearray(), [0, 0]

        async def read() -> bytes:
            await trio.lowlevel.wait_readable(stdin)
            return os.read(stdin, 4096)

        async def report_every_round() -> None:
            while True:
                await trio.sleep(ROUND_S)
                await on_progress({"elapsed_ms": 1, "stdout_bytes": len(out), "stderr_bytes": len(err),
                                   "stdout_tail_b64": base64.b64encode(out[sent[0]:]).decode(),
                                   "stderr_tail_b64": base64.b64encode(err[sent[1]:]).decode()})
                sent[:] = [len(out), len(err)]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(report_every_round)
            status = await _repl(read, out.extend, lambda: err.extend(b"> "))
            nursery.cancel_scope.cancel()
        return _reply(status, bytes(out), bytes(err))

    async def _terminal(self, request: ExecRequest) -> ExecReply:
        assert request.tty_fd is not None
        slave = request.tty_fd

        async def read() -> bytes:
            await trio.lowlevel.wait_readable(slave)
            return os.read(slave, 4096)  # a line at a time (canonical mode); b"" for ^D at a line's start

        def say(data: bytes) -> None:
            os.write(slave, b"\x1b[1m" + data + b"\x1b[0m")

        status = await _repl(read, say, lambda: os.write(slave, b"\x1b]0;title\x07\x1b[?2004h> "))
        return _reply(status, b"", b"")  # a terminal's output is not the helper's


Scenario = Callable[[Callable[..., Awaitable[dict[str, Any]]], Runtime, FakeHelper, str], Awaitable[Any]]


def _session(tmp_path: Path, scenario: Scenario) -> Any:
    """Run ``scenario(call, runtime, helper, capsule_id)`` over a fresh state dir and capsule;
    ``call(tool, args, owner=None)`` runs a tool as the token ``owner``, schemas checked."""
    state_dir = tmp_path / "state"
    workspace = tmp_path / "ws"
    workspace.mkdir()

    async def main() -> Any:
        runtime = Runtime(Config.from_env({"CCW_STATE_DIR": str(state_dir)}), State(state_dir), REGISTRY.run_outcome)
        helper = FakeHelper()
        runtime._helper = helper  # type: ignore[assignment]  # the runtime's one helper client

        async def call(tool: str, args: dict[str, Any], owner: str | None = None) -> dict[str, Any]:
            spec = REGISTRY.lookup(tool)
            assert spec is not None
            jsonschema.Draft202012Validator(spec.input_schema).validate(args)
            result: dict[str, Any] = await spec.handler(CallContext(runtime, owner=owner), args)
            jsonschema.Draft202012Validator(spec.output_schema).validate(result)
            return result

        try:
            record = await CallContext(runtime).capsules.create(CapsuleSpec(workspace=str(workspace)))
            return await scenario(call, runtime, helper, record.capsule_id)
        finally:
            await runtime.aclose()

    return trio.run(main)


def _exec_row(runtime: Runtime, capsule_id: str) -> dict[str, Any]:
    [row] = Journal(runtime.state).execs(capsule_id)
    return row


def test_a_piped_run_is_typed_into_and_read_back_then_journaled_with_what_was_typed(tmp_path: Path) -> None:
    async def scenario(call: Any, runtime: Runtime, helper: FakeHelper, cap: str) -> None:
        first = await call("capsule_exec", {"capsule_id": cap, "cmd": ["repl"], "interactive": True})
        assert first == {"status": "running", "run_id": first["run_id"], "elapsed_ms": first["elapsed_ms"],
                         "output": "> ", "cursor": 2}
        # The run holds the capsule's turn while it waits for input.
        assert [ticket.label for ticket in runtime.capsule_queue.line(cap)] == ["exec `repl`"]
        run_id = first["run_id"]
        second = await call("capsule_run", {"run_id": run_id, "input": "hello\n"})
        assert (second["status"], second["output"], second["cursor"]) == ("running", "HELLO\n> ", 10)
        last = await call("capsule_run", {"run_id": run_id, "input": "exit 3\n"})
        assert (last["status"], last["exit_code"], last["output"], last["cursor"]) == ("finished", 3, "bye\n", 14)
        assert (last["stdout"], last["stderr"], last["run_id"]) == ("HELLO\nbye\n", "> > ", run_id)
        assert runtime.capsule_queue.line(cap) == []
        [request] = helper.requests
        assert (request.stdio, request.stream, request.progress_ms, request.stdin) == ("stdin", True, 100, None)
        row = _exec_row(runtime, cap)
        assert base64.b64decode(row["stdin_b64"]) == b"hello\nexit 3\n" and not row["terminal"]
        assert (row["exit_code"], row["stdout_bytes"]) == (3, 10)

    _session(tmp_path, scenario)


def test_eof_closes_stdin_after_the_input_given_with_it(tmp_path: Path) -> None:
    async def scenario(call: Any, runtime: Runtime, helper: FakeHelper, cap: str) -> None:
        first = await call("capsule_exec", {"capsule_id": cap, "cmd": ["repl"], "interactive": True,
                                            "stdin": "first\n"})
        # stdin is the first input; one report's stdout comes before its stderr (the prompts)
        assert first["output"] == "FIRST\n> > "
        last = await call("capsule_run", {"run_id": first["run_id"], "input": "more\n", "eof": True})
        # The prompt (stderr) and "eof" (stdout) come in one report or two, as the machine's load has it.
        assert (last["status"], last["exit_code"]) == ("finished", 0)
        assert last["output"] in ("MORE\neof\n> ", "MORE\n> eof\n")
        assert base64.b64decode(_exec_row(runtime, cap)["stdin_b64"]) == b"first\nmore\n"

    _session(tmp_path, scenario)


def test_a_terminal_run_is_shown_without_control_sequences_and_journaled_with_its_output(tmp_path: Path) -> None:
    async def scenario(call: Any, runtime: Runtime, helper: FakeHelper, cap: str) -> None:
        first = await call("capsule_exec", {"capsule_id": cap, "cmd": ["repl"], "tty": True})
        assert first["output"] == "> "
        second = await call("capsule_run", {"run_id": first["run_id"], "input": "hi\n"})
        assert second["output"] == "hi\nHI\n> "  # the terminal's echo, then the answer
        last = await call("capsule_run", {"run_id": first["run_id"], "eof": True})
        assert (last["status"], last["exit_code"], last["output"]) == ("finished", 0, "eof\n")
        assert last["stdout"] == "> hi\nHI\n> eof\n" and "\x1b" not in last["stdout"]
        [request] = helper.requests
        assert (request.stdio, dict(request.env or {})["TERM"], request.stream) == ("tty", TERM, False)
        row = _exec_row(runtime, cap)
        assert base64.b64decode(row["stdin_b64"]) == b"hi\n"  # the ^D of eof is no input a replay gives
        assert not row["terminal"]  # its input is kept: a witness may carry it
        assert row["stdout_bytes"] == last["cursor"] > len(last["stdout"])  # the raw bytes, escapes and all

    _session(tmp_path, scenario)


def test_a_read_waits_for_output_to_pause_and_no_longer_than_wait_ms(tmp_path: Path) -> None:
    async def scenario(call: Any, runtime: Runtime, helper: FakeHelper, cap: str) -> None:
        run_id = (await call("capsule_exec", {"capsule_id": cap, "cmd": ["repl"], "interactive": True}))["run_id"]
        both = await call("capsule_run", {"run_id": run_id, "input": "slow\n"})
        assert ROUND_S < SLOW_GAP_S < QUIET_S / 2
        assert both["output"] == "one\ntwo\n> "  # two reports apart, one answer
        began = trio.current_time()
        quiet = await call("capsule_run", {"run_id": run_id, "input": "sleep\n", "wait_ms": 300})
        assert (quiet["status"], quiet["output"]) == ("running", "") and trio.current_time() - began < 0.9
        later = await call("capsule_run", {"run_id": run_id})
        assert later["output"] == "> "
        await call("capsule_run", {"run_id": run_id, "eof": True})

    _session(tmp_path, scenario)


def test_a_cursor_reads_again_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    async def scenario(call: Any, runtime: Runtime, helper: FakeHelper, cap: str) -> None:
        run_id = (await call("capsule_exec", {"capsule_id": cap, "cmd": ["repl"], "interactive": True}))["run_id"]
        await call("capsule_run", {"run_id": run_id, "input": "a\n"})
        again = await call("capsule_run", {"run_id": run_id, "cursor": 0, "wait_ms": 0})
        assert (again["output"], again["cursor"]) == ("> A\n> ", 6)
        with pytest.raises(CcwError) as refused:
            await call("capsule_run", {"run_id": run_id, "cursor": 7})
        assert refused.value.code == "INVALID_ARGUMENT"
        done = await call("capsule_run", {"run_id": run_id, "eof": True})
        assert done["output"] == "eof\n"
        assert (await call("capsule_run", {"run_id": run_id}))["output"] == ""  # read to the end already
        with pytest.raises(CcwError) as closed:
            await call("capsule_run", {"run_id": run_id, "input": "late\n"})
        assert closed.value.code == "CONFLICT"

    _session(tmp_path, scenario)


def test_a_run_is_its_token_s_only(tmp_path: Path) -> None:
    async def scenario(call: Any, runtime: Runtime, helper: FakeHelper, cap: str) -> None:
        started = await call("capsule_exec", {"capsule_id": cap, "cmd": ["repl"], "interactive": True}, "alice")
        with pytest.raises(CcwError) as other:
            await call("capsule_run", {"run_id": started["run_id"], "input": "x\n"}, "bob")
        assert other.value.code == "NOT_FOUND"
        ended = await call("capsule_run", {"run_id": started["run_id"], "input": "exit 0\n"}, "alice")
        assert ended["status"] == "finished"
        assert base64.b64decode(_exec_row(runtime, cap)["stdin_b64"]) == b"exit 0\n"  # bob typed nothing

    _session(tmp_path, scenario)


def test_cancel_answers_with_the_output_and_a_plain_run_takes_no_input(tmp_path: Path) -> None:
    async def scenario(call: Any, runtime: Runtime, helper: FakeHelper, cap: str) -> None:
        run_id = (await call("capsule_exec", {"capsule_id": cap, "cmd": ["repl"], "interactive": True,
                                              "wait_ms": 0}))["run_id"]
        await call("capsule_run", {"run_id": run_id, "wait_ms": 5000})  # its prompt came: it runs
        cancelled = await call("capsule_run", {"run_id": run_id, "cancel": True})
        assert cancelled["status"] == "cancelled" and "output" in cancelled and "cursor" in cancelled
        [cut] = Journal(runtime.state).execs(cap)  # as any cancelled exec: journaled cut short
        assert (cut["argv"], cut["exit_code"], cut["usage"]["cut_short"]) == (["repl"], None, CANCELLED)
        plain = await call("capsule_exec", {"capsule_id": cap, "cmd": ["true"], "wait_ms": 0})
        assert plain["status"] == "running" and "output" not in plain
        for args in ({"input": "x"}, {"eof": True}, {"cursor": 0}):
            with pytest.raises(CcwError) as refused:
                await call("capsule_run", {"run_id": plain["run_id"], **args})
            assert refused.value.code == "INVALID_ARGUMENT"
        assert (await call("capsule_run", {"run_id": plain["run_id"]}))["stdout"] == "plain\n"

    _session(tmp_path, scenario)


def test_input_is_bounded_per_call_and_in_all(monkeypatch: pytest.MonkeyPatch) -> None:
    typed = Console(terminal=False)
    with pytest.raises(CcwError) as one_call:
        typed.give(b"x" * (INPUT_MAX + 1))
    assert one_call.value.code == "TOO_LARGE"
    monkeypatch.setattr(console_module, "MAX_STDIN", 10)
    typed.give(b"x" * 6)
    with pytest.raises(CcwError) as in_all:
        typed.give(b"x" * 5)
    assert in_all.value.code == "TOO_LARGE"
    typed.give(b"x" * 4, eof=True)
    with pytest.raises(CcwError) as after_eof:
        typed.give(b"")
    assert after_eof.value.code == "CONFLICT"


def test_output_the_helper_could_not_deliver_is_said_where_it_was() -> None:
    async def main() -> str:
        with Console(terminal=False) as piped:
            piped.stream(ExecProgress(100, 3, 0, b"abc", b""))
            piped.stream(ExecProgress(200, 10, 2, b"hij", b"e!"))  # "defg" never came
            piped.finished(_reply(0, b"abc" + b"?" * 7 + b"kl", b"e!"))  # the capture carries the rest
            return piped.read_now(0).text

    assert trio.run(main) == "abc\n[ccw: 4 bytes of stdout lost: more than one report carries]\nhije!kl"


def test_the_end_of_file_character_is_the_terminal_s() -> None:
    import termios

    master, slave = os.openpty()
    try:
        assert termios.tcgetattr(slave)[6][termios.VEOF] == EOF_CHAR
    finally:
        os.close(master)
        os.close(slave)


def test_text_that_is_not_utf8_is_refused_by_argument_before_the_run_and_a_udcxx_types_its_byte(
        tmp_path: Path) -> None:
    # A lone surrogate (JSON "\ud800", or a command line's byte that is not UTF-8) used to pass the
    # argument checks and fail the call unexpectedly mid-turn, as the journal or the pipe encoded it.
    async def scenario(call: Any, runtime: Runtime, helper: FakeHelper, cap: str) -> None:
        for args, argument in (({"cmd": ["echo", "\ud800"]}, "cmd"), ({"cmd": ["echo", "\udcff"]}, "cmd"),
                               ({"cmd": ["repl"], "stdin": "a\ud800"}, "stdin"),
                               ({"cmd": ["repl"], "interactive": True, "stdin": "\ud800\n"}, "stdin")):
            with pytest.raises(CcwError) as refused:
                await call("capsule_exec", {"capsule_id": cap, **args})
            assert (refused.value.code, refused.value.details["argument"]) == ("INVALID_ARGUMENT", argument)
        assert helper.requests == [] and runtime.capsule_queue.line(cap) == []
        first = await call("capsule_exec", {"capsule_id": cap, "cmd": ["repl"], "interactive": True})
        with pytest.raises(CcwError) as refused:
            await call("capsule_run", {"run_id": first["run_id"], "input": "x\ud800\n"})
        assert (refused.value.code, refused.value.details["argument"]) == ("INVALID_ARGUMENT", "input")
        typed = await call("capsule_run", {"run_id": first["run_id"], "input": "a\udcffb\n", "eof": True})
        assert typed["status"] == "finished"
        assert base64.b64decode(_exec_row(runtime, cap)["stdin_b64"]) == b"a\xffb\n"

    _session(tmp_path, scenario)
