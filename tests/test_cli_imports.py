"""``ccw`` builds its parser from light modules: ``--help`` and parsing the common commands
import none of what only a command's run (or only the server) needs; RUN_TOOLS matches the registry."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mcp_server.capsules.run import WAIT_MS
from mcp_server.cli.capsule import RUN_TOOLS
from mcp_server.config import PROFILES, TOOLSETS
from mcp_server.tools.registry import Registry

# What parsing must not import, each with why (names and prefixes of sys.modules).
HEAVY = {
    "cryptography": "the TLS CA and witness keys (capsules/capsecrets.py, fs/witness_key.py), server or ccw witness",
    "jsonschema": "the tools' schemas, checked by the front end",
    "pydantic_core": "framing.py's fast JSON, for the frames a call sends",
    "trio": "the call on frontend.sock, once a command runs",
    "outcome": "cli/output.py's progress beside a call",
    "mcp_server.tools": "the tool adapters: loading the registry imports every family",
    "mcp_server.capsules": "the capsule service (runs, networks, secrets), the front end's",
    "mcp_server.cli.frontclient": "the MCP client of frontend.sock",
    "mcp_server.launcher": "starting and asking the helper (helperctl.ensure)",
    "mcp_server.frontdoor": "the front end's lock and socket",
    "mcp_server.framing": "JSON-RPC frames",
    "mcp_server.state": "SQLite, for log, show, watch, net, ui",
    "mcp_server.journal": "a capsule's runs, for log and show",
    "mcp_server.events": "the event stream, for watch",
    "mcp_server.core.policy": "policy reports, printed after promote or branch",
    "mcp_server.fs.witness_key": "the witness signing key (cryptography)",
    "sandbox.client": "the helper's client",
    "sandbox.ops": "the helper's op types",
    "sandbox.replies": "the helper's reply types",
}

PROBE = """
import json, sys
from mcp_server.cli import main, parse_args
argv = json.loads(sys.argv[1])
if argv == ["--help"]:
    try:
        main(argv)
    except SystemExit:
        pass
else:
    parse_args(argv)
print(json.dumps(sorted(sys.modules)))
"""


def loaded_after(argv: list[str]) -> list[str]:
    """The modules a fresh interpreter holds after ccw's ``main`` (``--help``) or parse of ``argv``."""
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, check=True,
                         timeout=120).stdout
    return json.loads(out.splitlines()[-1])  # --help's text comes first


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["capsule", "exec", "cap_1_ab", "--", "true"],
    ["capsule", "list"],
    ["capsule", "diff", "cap_1_ab"],
    ["capsule", "service", "list", "cap_1_ab"],
])
def test_parsing_imports_nothing_heavy(argv: list[str]) -> None:
    modules = loaded_after(argv)
    heavy = sorted(name for name in modules for prefix in HEAVY if name == prefix or name.startswith(prefix + "."))
    assert heavy == []
    assert "mcp_server.cli.capsule" in modules  # the parser was built, with the capsule verbs


def test_run_tools_are_the_tools_that_answer_through_runs() -> None:
    """RUN_TOOLS, to which a command gives ``wait_ms: null``, are the tools whose wait_ms takes null
    (capsules/run.py's WAIT_MS); capsule_network's wait_ms, a proposal's, is an integer only."""
    registry = Registry.load((*TOOLSETS, *PROFILES))
    waits = {spec.name: spec.input_schema["properties"].get("wait_ms") for spec in registry.tools}
    assert {name for name, wait in waits.items() if wait and "null" in wait["type"]} == RUN_TOOLS
    assert WAIT_MS["type"] == ["integer", "null"]
    assert waits["capsule_network"] == {"type": "integer"}
