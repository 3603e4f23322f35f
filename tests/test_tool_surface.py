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
    factor,
    hoist,
    shape_only,
)
from sandbox.errors import CcwError
from tests.mcp_process import CCW_MCP, server_env

REGISTRY = Registry.load(TOOLSETS)


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    if isinstance(schema, dict):
        if set(schema) == {"$ref"}:
            return _inline(defs[schema["$ref"].removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    return schema


@pytest.mark.parametrize("spec", REGISTRY.tools, ids=lambda spec: spec.name)
def test_factoring_loses_nothing(spec: Any) -> None:
    advertised = advertised_output_schema(spec)
    Draft202012Validator.check_schema(advertised)
    assert _inline(advertised, advertised.get("$defs", {})) == hoist(shape_only(spec.output_schema))
    assert "$schema" not in advertised_input_schema(spec)


def test_factoring_writes_a_repeated_piece_once() -> None:
    piece = {"type": "object", "properties": {"head": {"type": "string"}, "index": {"type": "string"}},
             "required": ["head", "index"], "additionalProperties": False}
    schema = {"type": "object", "properties": {"before": piece, "after": piece, "other": {"type": "integer"}}}
    factored = factor(schema)
    assert factored["properties"]["before"] == factored["properties"]["after"] == {"$ref": "#/$defs/before"}
    assert factored["$defs"] == {"before": piece}
    assert len(json.dumps(factored)) < len(json.dumps(schema))


HOISTABLE = {
    "type": "object",
    "oneOf": [
        {"properties": {"n": {"type": "integer"}, "kind": {"const": "a"}, "a": {"type": "string"}},
         "required": ["n", "kind", "a"]},
        {"properties": {"n": {"type": "integer"}, "kind": {"const": "b"}}, "required": ["n", "kind"],
         "not": {"required": ["a"]}},
    ],
}


@pytest.mark.parametrize("instance", [
    {"n": 1, "kind": "a", "a": "x"}, {"n": 1, "kind": "b"}, {"n": "1", "kind": "b"}, {"kind": "b"},
    {"n": 1, "kind": "b", "a": "x"}, {"n": 1, "kind": "c"}, {"n": 1, "kind": "a"}, {}, [], 3,
])
def test_hoisting_accepts_exactly_what_the_branches_did(instance: Any) -> None:
    hoisted = hoist(HOISTABLE)
    assert hoisted["properties"] == {"n": {"type": "integer"}} and hoisted["required"] == ["n", "kind"]
    assert (Draft202012Validator(hoisted).is_valid(instance)
            == Draft202012Validator(HOISTABLE).is_valid(instance))


def test_hoisting_leaves_closed_branches_alone() -> None:
    closed = json.loads(json.dumps(HOISTABLE))
    closed["oneOf"][0]["additionalProperties"] = False
    assert hoist(closed) == closed


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


def test_agent_profile_lists_under_15_kb(tmp_path: Path) -> None:
    lines = _session(tmp_path, "agent", [])
    listed = next(line for line in lines if json.loads(line)["id"] == 1)
    assert len(listed.encode()) < 15_000
    assert sorted(tool["name"] for tool in json.loads(listed)["result"]["tools"]) == sorted(PROFILES["agent"])
