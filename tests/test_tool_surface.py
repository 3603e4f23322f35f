"""The advertised tool surface: factored output schemas that accept what the full ones accept,
MCP-default annotations left out, and CCW_TOOLSETS profiles."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from mcp_server.config import PROFILES, TOOLSETS, Config
from mcp_server.tools.registry import Registry
from mcp_server.tools.surface import (
    advertised_annotations,
    advertised_input_schema,
    advertised_output_schema,
    shallow,
)
from sandbox.errors import CcwError
from tests.support.mcp_process import CCW_MCP, server_env

REGISTRY = Registry.load(TOOLSETS)


@pytest.mark.parametrize("spec", REGISTRY.tools, ids=lambda spec: spec.name)
def test_advertised_schemas_are_valid_and_shallow(spec: Any) -> None:
    advertised = advertised_output_schema(spec)
    Draft202012Validator.check_schema(advertised)
    Draft202012Validator.check_schema(advertised_input_schema(spec))
    assert "$schema" not in advertised_input_schema(spec)
    for name, summary in advertised.get("properties", {}).items():
        assert set(summary) <= {"type", "const", "enum"}, (name, summary)  # nothing nested
    full_names = {name for branch in [spec.output_schema, *spec.output_schema.get("oneOf", [])]
                  for name in branch.get("properties", {})}
    assert set(advertised.get("properties", {})) == full_names  # every field a result can have is named


@pytest.mark.parametrize("toolsets", [(name,) for name in (*TOOLSETS, *PROFILES)], ids=lambda t: t[0])
def test_every_served_spec_has_valid_schemas(toolsets: tuple[str]) -> None:
    """The server validates with these schemas without checking them first (CcwServer._checkers):
    each selection's specs, narrowed ones included, must be valid JSON Schema 2020-12."""
    for spec in Registry.load(toolsets).tools:
        Draft202012Validator.check_schema(spec.input_schema)
        Draft202012Validator.check_schema(spec.output_schema)


BRANCHED = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}},
    "oneOf": [
        {"type": "object", "properties": {"ok": {"const": True}, "value": {"type": "object", "properties": {
            "x": {"type": "string"}}, "required": ["x"]}, "size": {"type": ["integer", "null"]}},
         "required": ["ok", "value"], "additionalProperties": False},
        {"type": "object", "properties": {"ok": {"const": False}, "reason": {"enum": ["gone", "bad"]},
                                          "size": {"type": "string"}},
         "required": ["ok", "reason"], "additionalProperties": False},
        {"type": "object", "properties": {"ok": {"const": False}, "reason": {"const": "odd"},
                                          "extra": {"oneOf": [{"type": "string"}, {"type": "array"}]}},
         "required": ["ok", "reason"]},
    ],
}


def test_shallow_merges_branches_into_top_level_types() -> None:
    assert shallow(BRANCHED) == {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}, "value": {},
                       "size": {}, "reason": {"enum": ["gone", "bad", "odd"]},
                       "extra": {"type": ["string", "array"]}},
        "required": ["ok"],
    }
    closed = {**BRANCHED, "oneOf": BRANCHED["oneOf"][:2]}
    assert shallow(closed)["properties"]["value"] == {"type": "object"}  # the other branch forbids it
    assert shallow(closed)["properties"]["size"] == {"type": ["integer", "null", "string"]}
    assert shallow(closed)["required"] == ["ok"]


@pytest.mark.parametrize("instance", [
    {"ok": True, "value": {"x": "a"}}, {"ok": True, "value": {"x": "a"}, "size": None},
    {"ok": False, "reason": "odd", "n": 2},
    {"ok": False, "reason": "gone", "size": "big"}, {"ok": False, "reason": "odd", "value": 7, "extra": []},
    {"ok": False, "reason": "odd", "size": {"any": "thing"}, "extra": "e"},
])
def test_shallow_accepts_what_the_full_schema_accepts(instance: Any) -> None:
    assert Draft202012Validator(BRANCHED).is_valid(instance)
    assert Draft202012Validator(shallow(BRANCHED)).is_valid(instance)
    closed = {**BRANCHED, "oneOf": BRANCHED["oneOf"][:2]}
    if Draft202012Validator(closed).is_valid(instance):
        assert Draft202012Validator(shallow(closed)).is_valid(instance)


def test_policy_rules_are_advertised_by_shape_with_a_pointer_when_get_schema_is_listed() -> None:
    spec = REGISTRY.lookup("policy_set")
    alone = advertised_input_schema(spec, beside=["policy_set", "policy_get"])["properties"]["rules"]
    full = spec.input_schema["properties"]["rules"]["properties"]
    assert {name: rule.get("description") for name, rule in alone["properties"].items()} == {
        name: rule.get("description") for name, rule in full.items()}  # no get_schema to point to: documented here
    rules = advertised_input_schema(spec, beside=["policy_set", "get_schema"])["properties"]["rules"]
    assert "get_schema" in rules["description"] and "policy" in rules["description"]
    assert set(rules["properties"]) == set(spec.input_schema["properties"]["rules"]["properties"])
    assert "description" not in json.dumps(rules["properties"])
    assert len(json.dumps(spec.input_schema["properties"]["rules"])) > 3 * len(json.dumps(rules))


def test_annotations_keep_only_what_differs_from_mcp_defaults() -> None:
    assert advertised_annotations(REGISTRY.lookup("capsule_list")) == {"readOnlyHint": True, "openWorldHint": False}
    assert advertised_annotations(REGISTRY.lookup("capsule_destroy")) == {"openWorldHint": False}
    assert advertised_annotations(REGISTRY.lookup("capsule_exec")) == {"destructiveHint": False,
                                                                      "openWorldHint": False}


def test_profiles_name_real_tools_and_parse() -> None:
    for profile, names in PROFILES.items():
        assert [spec.name for spec in Registry.load([profile]).tools] == sorted(
            names, key=[spec.name for spec in REGISTRY.tools].index)
    config = Config.from_env({"CCW_TOOLSETS": "agent,witness"})
    names = {spec.name for spec in Registry.load(config.toolsets).tools}
    assert {"capsule_exec", "read_text_file", "witness_verify"} <= names and "snapshot_grep" not in names
    with pytest.raises(CcwError, match="profiles: agent"):
        Config.from_env({"CCW_TOOLSETS": "agnet"})


def _session(tmp_path: Path, toolsets: str, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    frames = [{"jsonrpc": "2.0", "id": 0, "method": "initialize",
               "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                          "clientInfo": {"name": "t", "version": "0"}}},
              {"jsonrpc": "2.0", "method": "notifications/initialized"},
              {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]
    frames += [{"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": name, "arguments": args}}
               for i, (name, args) in enumerate(calls, start=2)]
    done = subprocess.run([str(CCW_MCP)], input="".join(json.dumps(f) + "\n" for f in frames), text=True,
                          capture_output=True, env=server_env(tmp_path, CCW_TOOLSETS=toolsets), timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_results_conform_to_the_advertised_schemas(tmp_path: Path) -> None:
    calls = [("ccw_info", {}), ("policy_list", {}), ("policy_get", {"name": "strict"}), ("list_schemas", {}),
             ("get_schema", {"name": "policy"}), ("list_examples", {}),
             ("validate_asset", {"asset": {"name": "x"}, "schema": "policy"})]
    lines = _session(tmp_path, "server,policy,schema", calls)
    answers = {m["id"]: m for m in map(json.loads, lines)}
    listed = {tool["name"]: tool for tool in answers[1]["result"]["tools"]}
    for i, (name, _args) in enumerate(calls, start=2):
        result = answers[i]["result"]
        assert not result.get("isError"), result
        Draft202012Validator(listed[name]["outputSchema"]).validate(result["structuredContent"])


def _listed_bytes(tmp_path: Path, toolsets: str) -> tuple[int, list[dict[str, Any]]]:
    """The bytes of the tools/list answer line (with its newline, as `bench/run.py surface` counts), and the tools."""
    listed = next(line for line in _session(tmp_path, toolsets, []) if json.loads(line)["id"] == 1)
    return len(listed.encode()) + 1, json.loads(listed)["result"]["tools"]


def test_full_list_costs_at_most_1_kb_per_tool(tmp_path: Path) -> None:
    size, tools = _listed_bytes(tmp_path, ",".join(TOOLSETS))
    assert len(tools) == len(REGISTRY.tools)
    assert size <= 1024 * len(tools), f"tools/list is {size} B for {len(tools)} tools ({size // len(tools)} B/tool)"


def test_agent_profile_lists_under_15_kb(tmp_path: Path) -> None:
    size, tools = _listed_bytes(tmp_path, "agent")
    assert size < 15_000, f"the agent profile lists {size} B"
    assert sorted(tool["name"] for tool in tools) == sorted(PROFILES["agent"])
