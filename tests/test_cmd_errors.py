"""A bad command over MCP is refused naming the argument the caller sent (``cmd``, deltamin's
``target_cmd``), not the helper's field for it (its exec op's ``argv``): the tool adapters
check it under their own name before the call waits for a turn or reaches the helper
(docs/names.md, "cmd and argv").  No helper runs here, so only that check can answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.checks import MAX_ARGV
from tests.support.raw_mcp import RawStdio

CAPSULE = "cap_0001700000000000_1a2b"  # well formed; never made (the check comes first)
BAD = {
    "nul": ["echo", "a\x00b"],
    "not utf-8": ["echo", "\ud800"],  # a lone surrogate: it failed the call unexpectedly, mid-turn
    "no program": [""],
    "too many": ["true"] * (MAX_ARGV + 1),
}
CALLS = [
    ("capsule_exec", "cmd", {"capsule_id": CAPSULE}),
    ("capsule_race", "cmd", {"capsule_ids": [CAPSULE]}),
    ("capsule_deltamin", "target_cmd", {"capsule_id": CAPSULE}),
    ("capsule_service_start", "cmd", {"capsule_id": CAPSULE, "name": "web"}),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RawStdio]:
    state: Path = tmp_path_factory.mktemp("cmd") / "state"
    # No helper at this socket: a call that got past the check would fail UNAVAILABLE instead.
    with RawStdio(state, "capsule", tasks=False, CCW_HELPER_SOCKET=str(state.parent / "no-helper.sock")) as raw:
        yield raw


def _named(answer: dict[str, Any]) -> str:
    """The argument a refused tool call names: its schema's (``details.errors``, capsule_service_start's
    ``cmd`` has maxItems) or its CcwError's (``details.argument``); both INVALID_ARGUMENT tool errors
    to this 2026 session."""
    result = answer["result"]
    assert result.get("isError"), answer
    error = result["structuredContent"]["error"]
    assert error["code"] == "INVALID_ARGUMENT" and "argv" not in error["message"], error
    if "errors" in error["details"]:
        paths = {problem["path"] for problem in error["details"]["errors"]}
        assert len(paths) == 1, answer
        return str(paths.pop()).removeprefix("/")  # a JSON pointer: "/cmd"
    assert f"argument {error['details']['argument']!r}" in error["message"], error
    return str(error["details"]["argument"])


@pytest.mark.parametrize("tool,argument,args", CALLS, ids=[call[0] for call in CALLS])
@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_command_is_refused_under_its_own_name(server: RawStdio, tool: str, argument: str,
                                                     args: dict[str, Any], bad: str) -> None:
    answer = server.request("tools/call", {"name": tool, "arguments": {**args, argument: BAD[bad]}})
    assert _named(answer) == argument


def test_an_empty_command_is_refused_by_the_schema_naming_cmd(server: RawStdio) -> None:
    answer = server.request("tools/call", {"name": "capsule_exec", "arguments": {"capsule_id": CAPSULE, "cmd": []}})
    assert _named(answer) == "cmd"


def test_a_service_env_value_that_is_not_utf8_is_refused_by_name(server: RawStdio) -> None:
    # It used to reach the helper, whose refusal failed the service already recorded as started.
    args = {"capsule_id": CAPSULE, "name": "web", "cmd": ["true"], "env": {"PATH": "/bin\ud800"}}
    assert _named(server.request("tools/call", {"name": "capsule_service_start", "arguments": args})) == "env.PATH"
