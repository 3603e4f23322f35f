"""The schema tool family, called as the server calls it; every result checked against its output schema."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio

from mcp_server.config import Config
from mcp_server.core.canonical import canonical_json
from mcp_server.tools import schema as schema_tools
from mcp_server.tools.registry import Registry, ToolSpec

FIXTURES = Path(__file__).parent / "schema_fixtures"
SPECS = {spec.name: spec for spec in schema_tools.TOOLS}


class Ctx:
    """A ToolContext for direct handler calls."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state = None
        self.logged: list[str] = []

    async def helper(self) -> Any:
        raise AssertionError("schema tools never need the helper")

    async def roots(self) -> list[str] | None:
        return None

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: Any = None) -> None:
        return None

    def log(self, message: str) -> None:
        self.logged.append(message)
        print(message, file=sys.stderr)


def call(ctx: Ctx, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run a handler the way the server does, and check the result against its output schema."""
    spec: ToolSpec = SPECS[tool]
    jsonschema.Draft202012Validator(spec.input_schema).validate(args)
    result = trio.run(spec.handler, ctx, args)
    jsonschema.Draft202012Validator(spec.output_schema).validate(result)
    json.dumps(result, allow_nan=False)
    return result


@pytest.fixture
def public() -> Ctx:
    """A public-style schema set, chosen with seed 001's SYN_* names."""
    return Ctx(
        Config.from_env(
            {"SYN_SCHEMAS_DIR": str(FIXTURES / "jsonschema"), "SYN_EXAMPLES_DIR": str(FIXTURES / "examples")}
        )
    )


@pytest.fixture
def own() -> Ctx:
    """ccw's own schema set (nothing configured)."""
    return Ctx(Config.from_env({}))


def test_every_spec_is_well_formed() -> None:
    for spec in schema_tools.TOOLS:
        assert spec.family == "schema"
        jsonschema.Draft202012Validator.check_schema(spec.input_schema)
        jsonschema.Draft202012Validator.check_schema(spec.output_schema)
        assert spec.output_schema["type"] == "object"
        for example in spec.input_schema["examples"]:
            jsonschema.Draft202012Validator(spec.input_schema).validate(example)
    registry = Registry.load(["schema"])
    assert registry.lookup("validate") is SPECS["validate_asset"]
    assert registry.is_deprecated_alias("validate")
    assert not registry.is_deprecated_alias("validate_asset")


def test_list_and_get_schemas_from_a_configured_dir(public: Ctx) -> None:
    listed = call(public, "list_schemas", {})
    assert listed["ok"] is True
    assert [(s["name"], s["version"]) for s in listed["schemas"]][-2:] == [("tone", "0.9.0"), ("tone", "1.0.0")]
    got = call(public, "get_schema", {"name": "shader"})
    assert got["ok"] is True and got["version"] == "unversioned"
    assert got["schema"] == json.loads((FIXTURES / "jsonschema/shader.schema.json").read_text())
    assert call(public, "get_schema", {"name": "0.9.0/tone.schema.json"})["version"] == "0.9.0"
    assert call(public, "get_schema", {"name": "nested-shader"})["schema"] == got["schema"]
    assert call(public, "get_schema", {"name": "nope"}) == {"ok": False, "reason": "not_found"}
    rejected = call(public, "get_schema", {"name": "../examples/Shader_Example.json"})
    assert rejected["reason"] == "validation_failed" and rejected["errors"][0]["path"] == "/name"


def test_examples_listing_and_call_time_validation(public: Ctx) -> None:
    assert call(public, "list_examples", {}) == call(public, "list_examples", {"component": "all"})
    assert call(public, "list_examples", {"component": "synesthetic-asset"}) == {
        "ok": True,
        "examples": [{"component": "synesthetic-asset", "path": "SynestheticAsset_Example1.json"}],
    }
    good = call(public, "get_example", {"path": "SynestheticAsset_Example1.json"})
    assert good["ok"] is True and good["schema"] == "synesthetic-asset" and good["validated"] is True
    assert good["example"]["$schemaRef"] == "jsonschema/synesthetic-asset.schema.json"
    bad = call(public, "get_example", {"path": "Shader_Broken.json"})
    assert bad["ok"] is True and bad["schema"] == "shader" and bad["validated"] is False
    assert call(public, "get_example", {"path": "Truncated_Example.json"}) == {"ok": False, "reason": "not_found"}
    assert call(public, "get_example", {"path": "missing.json"}) == {"ok": False, "reason": "not_found"}
    for path in ("../jsonschema/shader.schema.json", "/etc/passwd", "sub/../../x.json"):
        result = call(public, "get_example", {"path": path})
        assert result["ok"] is False and result["reason"] == "validation_failed"
        assert result["errors"][0]["path"] == "/path" and "rejected" in result["errors"][0]["msg"]


def test_validate_asset_shapes(public: Ctx) -> None:
    assert call(public, "validate_asset", {"asset": {"name": "a"}, "schema": "synesthetic-asset"}) == {"ok": True}
    assert call(public, "validate_asset", {"asset": {"name": 3, "shader": {}}, "schema": "synesthetic-asset"}) == {
        "ok": False,
        "reason": "validation_failed",
        "errors": [
            {"path": "/name", "msg": "3 is not of type 'string'"},
            {"path": "/shader", "msg": "'fragment_shader' is a required property"},
            {"path": "/shader", "msg": "'name' is a required property"},
        ],
    }
    for args in ({"asset": {}}, {"asset": {}, "schema": ""}):
        missing = call(public, "validate_asset", args)
        assert missing["reason"] == "validation_failed"
        assert missing["errors"] == [{"path": "", "msg": "schema is required: name the schema to validate against"}]


def test_validate_many_results_and_batch_limit(public: Ctx) -> None:
    assets = [{"name": "ok"}, {"name": ""}, {"name": "fine", "extra": 1}]
    result = call(public, "validate_many", {"assets": assets, "schema": "synesthetic-asset"})
    assert result["ok"] is True
    assert [r["ok"] for r in result["results"]] == [True, False, False]
    assert result["results"][1]["errors"] == [{"path": "/name", "msg": "'' should be non-empty"}]
    assert call(public, "validate_many", {"assets": [], "schema": "shader"}) == {"ok": True, "results": []}
    assert call(public, "validate_many", {"assets": assets})["reason"] == "validation_failed"

    limited = Ctx(dataclasses.replace(public.config, max_batch=2))
    over = call(limited, "validate_many", {"assets": assets, "schema": "synesthetic-asset"})
    assert over["ok"] is False and over["reason"] == "unsupported" and "MCP_MAX_BATCH=2" in over["detail"]
    at = call(limited, "validate_many", {"assets": assets[:2], "schema": "synesthetic-asset"})
    assert at["ok"] is True and len(at["results"]) == 2
    default = Ctx(Config.from_env({"CCW_SCHEMAS_DIR": str(FIXTURES / "jsonschema")}))
    assert default.config.max_batch == 100
    assert call(default, "validate_many", {"assets": [{}] * 101, "schema": "shader"})["reason"] == "unsupported"
    assert len(call(default, "validate_many", {"assets": [{}] * 100, "schema": "shader"})["results"]) == 100


def test_diff_assets_shape_and_determinism(public: Ctx) -> None:
    args = {"base": {"b": [1], "a": {"x": 1, "y": 2}}, "new": {"a": {"x": 2}, "b": [1, 2], "c": None}}
    result = call(public, "diff_assets", args)
    assert result == {
        "ok": True,
        "patch": [
            {"op": "replace", "path": "/a/x", "value": 2},
            {"op": "remove", "path": "/a/y"},
            {"op": "replace", "path": "/b", "value": [1, 2]},
            {"op": "add", "path": "/c", "value": None},
        ],
    }
    assert canonical_json(call(public, "diff_assets", args)) == canonical_json(result)


def test_populate_backend_is_unsupported_without_a_backend(public: Ctx) -> None:
    assert call(public, "populate_backend", {"asset": {"name": "a"}, "validate_first": False}) == {
        "ok": False,
        "reason": "unsupported",
        "detail": "populate_backend is disabled: set CCW_BACKEND_URL (or SYN_BACKEND_URL)",
    }


def test_ccw_own_schema_set_holds_every_tools_io_and_policies(own: Ctx) -> None:
    names = {s["name"] for s in call(own, "list_schemas", {})["schemas"]}
    for spec in Registry.load(own.config.toolsets).tools:
        assert {f"tool.{spec.name}.input", f"tool.{spec.name}.output"} <= names
        got = call(own, "get_schema", {"name": f"tool.{spec.name}.output"})
        assert got["schema"] == spec.output_schema and got["schema"] is not spec.output_schema
    assert "policy" in names
    examples = call(own, "list_examples", {})["examples"]
    assert {"component": "tool.diff_assets.input", "path": "tools/diff_assets/example-1.json"} in examples
    for example in examples:
        got = call(own, "get_example", {"path": example["path"]})
        assert got["ok"] is True and got["schema"] == example["component"]
        assert got["validated"] is True, example


def test_own_examples_are_honest_calls(own: Ctx) -> None:
    # Each tool's example call, made for real, gives a result its output schema accepts.
    for spec in schema_tools.TOOLS:
        for example in spec.input_schema["examples"]:
            call(own, spec.name, example)
    assert call(own, "validate_asset", SPECS["validate_asset"].input_schema["examples"][0]) == {"ok": True}
