"""The call the capsule service serves (mcp_server/capsules/call_hooks.py): who is asked about
an exec's misses is a typed hook, decided by whoever makes the service (a call's context: its
client; background work and a race's execs: nobody); and the environment that stands in for a
caller that lent none is decided by caller.Caller alone, for the capsule service too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.caller import Caller
from mcp_server.capsules.asker import Asker
from mcp_server.capsules.call_hooks import CallHooks, Unattended
from mcp_server.capsules.exec import whitelisted
from mcp_server.config import Config
from mcp_server.context import CallContext, Runtime
from mcp_server.state import State
from sandbox.errors import CcwError


def _asker_of(tmp_path: Path, session: Any) -> Asker | None:
    async def main() -> Asker | None:
        runtime = Runtime(Config.from_env({"CCW_STATE_DIR": str(tmp_path / "state")}), State(tmp_path / "state"))
        try:
            hooks: CallHooks = CallContext(runtime, session=session, request_id=7)  # typed: the protocol's
            return hooks.asker()
        finally:
            await runtime.aclose()

    return trio.run(main)


def test_a_call_with_a_client_asks_it_and_one_without_asks_nobody(tmp_path: Path) -> None:
    session = object()  # the SDK's session of the call's client
    asker = _asker_of(tmp_path, session)
    assert isinstance(asker, Asker) and asker == Asker(session, 7)
    assert _asker_of(tmp_path, None) is None  # an in-process call: no client to ask


def test_background_work_asks_nobody_and_takes_no_turn() -> None:
    hooks: CallHooks = Unattended()
    assert hooks.asker() is None
    with pytest.raises(CcwError) as refused:
        hooks.capsule_turn("cap_1", "exec")
    assert refused.value.code == "INTERNAL"


def test_the_whitelist_takes_what_was_lent_else_what_caller_lets_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOO", "ours")
    monkeypatch.setenv("HOME", "/root")
    assert whitelisted(("FOO", "HOME"), None) == {"FOO": "ours"} == whitelisted(("FOO",), Caller().env)
    assert whitelisted(("FOO", "HOME"), {"FOO": "lent", "HOME": "/x"}) == {"FOO": "lent"}
    assert whitelisted(("FOO",), {}) == {}  # an empty environment lent is the caller's, not ours
