"""mcp_server/cli/toolwords.py: a tool named in what ``ccw`` prints is said as the command that
does the same, and each command of its table is one the CLI's parser takes and that calls that tool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mcp_server.cli import frontclient, main
from mcp_server.cli.toolwords import COMMANDS, in_cli_words
from sandbox.errors import CcwError

# A whole command line for each tool of the table: its command's words, then what the command needs.
SAMPLES = {
    "capsule_create": ["{ws}"], "capsule_exec": ["cap_1", "--", "true"], "capsule_diff": ["cap_1"],
    "capsule_promote": ["cap_1"], "capsule_witness": ["cap_1"], "capsule_replay": ["wit_1"], "capsule_list": [],
    "capsule_destroy": ["cap_1"], "capsule_fork": ["cap_1"], "capsule_deltamin": ["cap_1", "--", "true"],
    "capsule_race": ["cap_1", "cap_2", "--", "true"], "capsule_merge": ["cap_1", "cap_2"],
    "capsule_network": ["cap_1"], "capsule_port": ["cap_1", "8080"], "capsule_pause": ["cap_1"],
    "capsule_resume": ["cap_1"], "capsule_service_start": ["cap_1", "web", "--", "true"],
    "capsule_service_list": ["cap_1"], "capsule_service_logs": ["cap_1", "web"],
    "capsule_service_stop": ["cap_1", "web"],
}
REFUSAL = "capsule cap_1 not found; call capsule_list to see live capsules or capsule_create to make one"


def test_each_command_of_the_table_calls_its_tool_and_says_the_tools_error_in_commands(
        tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    called: list[str] = []

    async def call_tool(config: Any, name: str, args: dict[str, Any], *rest: Any, **options: Any) -> dict[str, Any]:
        called.append(name)
        raise CcwError("NOT_FOUND", REFUSAL)

    monkeypatch.setenv("CCW_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(frontclient, "call_tool", call_tool)
    monkeypatch.setattr("mcp_server.cli.helperctl.ensure", lambda *args, **kwargs: None)  # no helper is asked
    words = COMMANDS[tool].split()
    assert words[0] == "ccw"
    status = main([*words[1:], *(arg.format(ws=tmp_path) for arg in SAMPLES[tool])])
    assert (status, called) == (1, [tool])
    assert capsys.readouterr().err == ("ccw: NOT_FOUND: capsule cap_1 not found; run ccw capsule list to see live "
                                       "capsules or ccw capsule create to make one\n")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tool" in metafunc.fixturenames:
        assert set(SAMPLES) == set(COMMANDS)
        metafunc.parametrize("tool", sorted(COMMANDS))


def test_tool_names_are_said_as_commands_unless_the_text_says_the_command_already() -> None:
    assert in_cli_words("capsule_promote will refuse with REPO_CHANGED") == \
        "ccw capsule promote will refuse with REPO_CHANGED"
    assert in_cli_words("stop it (capsule_service_stop), then capsule_service_list") == \
        "stop it (ccw capsule service stop), then ccw capsule service list"
    both = "fork it (capsule_fork, ccw capsule fork CAP): the fork starts from its files"
    assert in_cli_words(both) == both
    for left in ("give it to capsule_run to wait again", "capsule_id must be given", "capsule_list_x", "policy_set"):
        assert in_cli_words(left) == left  # no command, or no tool
