"""The front end's network wiring that needs no kernel: CLI flags, the exec's text block, records in results."""

from __future__ import annotations

import json

import pytest

from mcp_server.capsules.exec import NETWORK_NONE_REASON, ExecOutcome
from mcp_server.cli import parse_args
from mcp_server.cli.capsule import tool_call
from mcp_server.tools.exec_result import exec_text
from sandbox.replies import ExecReply


def test_create_takes_repeatable_network_rules_and_caps() -> None:
    _, call, _ = tool_call(parse_args(["capsule", "create", "/w", "--network", "pypi.org:443", "--network",
                                       "*.pythonhosted.org", "--net-max-bytes", "1000"]))
    assert call["network"] == {"allow": ["pypi.org:443", "*.pythonhosted.org"], "max_bytes": 1000}
    _, plain, _ = tool_call(parse_args(["capsule", "create", "/w"]))
    assert "network" not in plain


def test_caps_without_a_rule_are_a_usage_error() -> None:
    with pytest.raises(SystemExit, match="need at least one --network"):
        tool_call(parse_args(["capsule", "create", "/w", "--net-max-connections", "3"]))


def test_the_text_block_ends_with_the_denials() -> None:
    result = {"exit_code": 7, "network_notes": ["ccw network: denied tcp 10.0.0.5:22: direct connection"]}
    first, *rest = exec_text(result).split("\n")
    assert json.loads(first) == result and rest == result["network_notes"]
    assert exec_text({"exit_code": 0, "network_notes": []}).count("\n") == 0


def _reply() -> ExecReply:
    return ExecReply.from_args({
        "exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False, "duration_ms": 1,
        "stdout_b64": "", "stderr_b64": "", "stdout_bytes": 0, "stderr_bytes": 0,
        "truncated": {"stdout": False, "stderr": False},
        "usage": {"cpu_ms": 1, "rss_max_kb": 1, "rss_max_process_kb": 1, "io_read_kb": 0, "io_write_kb": 0},
        "usage_unavailable": {}, "usage_sources": {}, "disk": None,
        "touched": {"read": [], "written": [], "listed": [], "executed": []}, "touched_unavailable": {},
    })


def test_an_outcome_carries_its_records_or_says_why_there_are_none() -> None:
    record = {"host": "pypi.org", "port": 443, "protocol": "https", "allowed": True}
    with_network = ExecOutcome(_reply(), 0, 0, 0, [record], ())
    assert with_network.touched["network"] == [record] and "network" not in with_network.touched_unavailable
    without = ExecOutcome(_reply(), 0, 0, 0)
    assert without.touched["network"] is None and without.touched_unavailable["network"] == NETWORK_NONE_REASON
