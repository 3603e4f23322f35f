"""What a caller lends a call, decided once (mcp_server/caller.py ``lent``, ``lending``) and
read by tools as typed ToolContext fields (context.py); capsule_exec (tools/exec.py) runs its
command with them: the whitelist's values and TERM from the lent environment, on the lent
terminal, else from ours; and it keeps its place in tools/list after its move."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.caller import (
    CALLER_META,
    CALLER_TERMINAL,
    CALLER_TRUSTED,
    NOTHING_LENT,
    PASSED_FDS,
    Caller,
    PassedFds,
    lending,
    lent,
)
from mcp_server.capsules.run import Run
from mcp_server.config import TOOLSETS, Config
from mcp_server.context import CallContext, Runtime
from mcp_server.state import State
from mcp_server.tools import exec as exec_tool
from mcp_server.tools.registry import Registry
from sandbox.errors import CcwError
from sandbox.ops import CreateRequest, ExecRequest, ListRequest, OpRequest
from sandbox.replies import CreateReply, ListReply, OpReply
from sandbox.spec import CapsuleSpec
from tests.support.descriptors import is_closed
from tests.support.scratch_services import exec_reply

LENT = {CALLER_META: {"env": {"FOO": "lent", "TERM": "xterm-lent", "N": 1}, "workspace": "/lent/ws"}}


@pytest.fixture
def trusted() -> Any:
    """A connection of our own uid (stdio, frontend.sock), with a place for passed descriptors."""
    passed = PassedFds()
    tokens = CALLER_TRUSTED.set(True), PASSED_FDS.set(passed)
    try:
        yield passed
    finally:
        CALLER_TRUSTED.reset(tokens[0])
        PASSED_FDS.reset(tokens[1])
        passed.close()


def test_nothing_lent_means_ours() -> None:
    assert lent(LENT) == NOTHING_LENT  # an untrusted connection (HTTP) lends nothing, whatever _meta says
    assert NOTHING_LENT.env is os.environ and NOTHING_LENT.terminal is None and NOTHING_LENT.workspace is None


def test_a_trusted_call_lends_its_environment_workspace_and_terminal(trusted: PassedFds) -> None:
    master, slave = os.openpty()
    os.close(master)
    trusted.add([os.dup(slave)])
    with lending({**LENT, CALLER_TERMINAL: True}, "capsule_exec") as caller:
        assert caller.env == {"FOO": "lent", "TERM": "xterm-lent"} and caller.workspace == "/lent/ws"
        assert caller.terminal is not None and os.path.samestat(os.fstat(caller.terminal), os.fstat(slave))
    assert is_closed(caller.terminal)  # the block (the call) ended: the server's copy is closed
    trusted.add([os.dup(slave)])
    with pytest.raises(RuntimeError), lending({**LENT, CALLER_TERMINAL: True}, "capsule_exec") as failed:
        raise RuntimeError("the call failed")
    assert failed.terminal is not None and is_closed(failed.terminal)
    os.close(slave)
    assert lent(LENT) == Caller({"FOO": "lent", "TERM": "xterm-lent"}, "/lent/ws")  # no terminal taken


class MakingHelper:
    """Makes capsules, lists them, and answers each exec as one that touched nothing."""

    def __init__(self) -> None:
        self.execs: list[ExecRequest] = []

    async def call(self, request: OpRequest, on_progress: Any = None) -> OpReply:
        if isinstance(request, CreateRequest):
            return CreateReply("cap_1", "/m", request.spec.workspace, "", "", {})
        if isinstance(request, ExecRequest):
            self.execs.append(request)
            return exec_reply()
        assert isinstance(request, ListRequest), request
        return ListReply(())


def _exec(tmp_path: Path, caller: Caller, args: dict[str, Any]) -> tuple[list[ExecRequest], CallContext]:
    """capsule_exec's handler called with what ``caller`` lent, in a capsule whose whitelist is FOO."""
    (tmp_path / "ws").mkdir(exist_ok=True)
    spec = Registry.load(TOOLSETS).lookup("capsule_exec")
    assert spec is not None and spec.handler is exec_tool.capsule_exec

    async def main() -> tuple[list[ExecRequest], CallContext]:
        runtime = Runtime(Config.from_env({"CCW_STATE_DIR": str(tmp_path / "state")}), State(tmp_path / "state"))
        helper = MakingHelper()
        runtime._helper = helper  # type: ignore[assignment]  # the runtime's one helper client
        try:
            record = await CallContext(runtime).capsules.create(
                CapsuleSpec(workspace=str(tmp_path / "ws"), env_whitelist=("FOO",)))
            ctx = CallContext(runtime, caller=caller)
            await spec.handler(ctx, {"capsule_id": record.capsule_id, **args})
            return helper.execs, ctx
        finally:
            await runtime.aclose()

    return trio.run(main)


def test_capsule_exec_runs_with_what_the_caller_lent(tmp_path: Path) -> None:
    master, slave = os.openpty()
    try:
        caller = Caller({"FOO": "lent", "TERM": "xterm-lent"}, None, slave)
        [request], ctx = _exec(tmp_path, caller, {"cmd": ["sh"]})
        assert request.env == {"FOO": "lent", "TERM": "xterm-lent"}
        assert request.stdio == "tty" and request.tty_fd == slave
        # A run's body sees the call's caller too (the run may outlive the call's answer).
        async def for_run() -> Any:
            return ctx.for_run(Run("r1", "capsule_exec", None))

        run_ctx = trio.run(for_run)
        assert run_ctx.caller_env == caller.env and run_ctx.terminal == slave and run_ctx.caller_lent
        with pytest.raises(CcwError) as refused:  # a shell's call is interactive already
            _exec(tmp_path, caller, {"cmd": ["sh"], "interactive": True})
        assert refused.value.code == "INVALID_ARGUMENT" and "drop interactive" in refused.value.message
    finally:
        os.close(master)
        os.close(slave)


def test_capsule_exec_takes_our_environment_when_nothing_was_lent(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOO", "ours")
    [request], ctx = _exec(tmp_path, NOTHING_LENT, {"cmd": ["true"]})
    assert request.env == {"FOO": "ours"} and request.stdio != "tty" and request.tty_fd is None
    assert ctx.caller_env is os.environ and not ctx.caller_lent and ctx.terminal is None
    assert ctx.workspace == ctx.config.workspace


def test_capsule_exec_keeps_its_place_in_tools_list() -> None:
    names = [spec.name for spec in Registry.load(TOOLSETS).tools]
    assert names[:3] == ["capsule_create", "capsule_exec", "capsule_diff"]
    assert exec_tool.LISTED_AFTER == "capsule_create"
    registry = Registry()
    with pytest.raises(ValueError, match="not registered before it"):
        registry.add(exec_tool.TOOLS[0], exec_tool.LISTED_AFTER)
    assert registry.tools == [] and registry.lookup("capsule_exec") is None
