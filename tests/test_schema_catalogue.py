"""The schema catalogue: listing, lookup, local-only $ref, traversal, immutability, ordering."""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from mcp_server.core.canonical import canonical_json
from mcp_server.core.schema import SchemaCatalogue, UnsafePath, check_relative_path
from mcp_server.fs.schemafiles import catalogue_from_dirs

FIXTURES = Path(__file__).parent / "schema_fixtures"
SCHEMAS = FIXTURES / "jsonschema"
EXAMPLES = FIXTURES / "examples"


@pytest.fixture
def catalogue() -> SchemaCatalogue:
    return catalogue_from_dirs(str(SCHEMAS), str(EXAMPLES))


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Fail loudly on any attempt to resolve a name or open a connection."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


def test_every_json_file_is_listed_sorted_with_name_version_path(catalogue: SchemaCatalogue) -> None:
    assert catalogue.list_schemas() == [
        {"name": "number", "version": "unversioned", "path": "common/number.schema.json"},
        {"name": "parameter", "version": "unversioned", "path": "common/parameter.schema.json"},
        {"name": "range", "version": "unversioned", "path": "common/range.schema.json"},
        {"name": "remote", "version": "unversioned", "path": "remote.schema.json"},
        {"name": "shader", "version": "unversioned", "path": "shader.schema.json"},
        {"name": "synesthetic-asset", "version": "unversioned", "path": "synesthetic-asset.schema.json"},
        {"name": "tone", "version": "0.9.0", "path": "0.9.0/tone.schema.json"},
        {"name": "tone", "version": "1.0.0", "path": "tone.schema.json"},
    ]


def test_a_name_picks_the_highest_version_and_a_path_picks_that_file(catalogue: SchemaCatalogue) -> None:
    assert catalogue.find("tone")[0].path == "tone.schema.json"  # type: ignore[union-attr]
    assert catalogue.find("0.9.0/tone.schema.json")[0].version == "0.9.0"  # type: ignore[union-attr]
    assert catalogue.find("nothing") == (None, False)


def test_nested_name_is_the_canonical_schema(catalogue: SchemaCatalogue) -> None:
    entry, nested = catalogue.find("nested-synesthetic-asset")
    assert entry is not None and entry.name == "synesthetic-asset" and nested


def test_refs_resolve_across_files_by_id_and_by_file_path(catalogue: SchemaCatalogue, no_network: list[Any]) -> None:
    asset = json.loads((EXAMPLES / "SynestheticAsset_Example1.json").read_text())
    assert catalogue.validate(asset, "nested-synesthetic-asset") == []
    asset["tone"]["parameters"][0]["min"] = "low"  # through $id refs two files deep
    asset["shader"]["uniforms"][0]["default"] = "half"
    assert catalogue.validate(asset, "nested-synesthetic-asset") == [
        {"path": "/shader/uniforms/0/default", "msg": "'half' is not of type 'number'"},
        {"path": "/tone/parameters/0/min", "msg": "'low' is not of type 'number'"},
    ]
    # common/range.schema.json has no $id: its relative refs resolve against its file path.
    assert catalogue.validate({"low": 1, "high": 2}, "range") == []
    assert catalogue.validate({"low": 1, "high": "x"}, "range") == [
        {"path": "/high", "msg": "'x' is not of type 'number'"}
    ]
    assert no_network == []


def test_remote_ref_is_refused_without_any_network_attempt(catalogue: SchemaCatalogue, no_network: list[Any]) -> None:
    errors = catalogue.validate({"thing": 1}, "remote")
    assert len(errors) == 1 and errors[0]["path"] == ""
    assert "remote retrieval is refused" in errors[0]["msg"]
    assert "https://schemas.remote.invalid/thing.schema.json" in errors[0]["msg"]
    assert no_network == []
    # Without the property that reaches the $ref, nothing needs resolving.
    assert catalogue.validate({}, "remote") == []


def test_nested_alias_ignores_top_level_schema_ref_only(catalogue: SchemaCatalogue) -> None:
    asset = {"$schemaRef": "jsonschema/synesthetic-asset.schema.json", "name": "x"}
    assert catalogue.validate(asset, "nested-synesthetic-asset") == []
    assert catalogue.validate(asset, "synesthetic-asset") == [
        {"path": "", "msg": "Additional properties are not allowed ('$schemaRef' was unexpected)"}
    ]
    assert asset["$schemaRef"]  # the caller's asset is untouched


def test_errors_are_sorted_by_path_then_message(catalogue: SchemaCatalogue) -> None:
    asset = {"name": "", "shader": {"uniforms": [{"default": "a"}, 3]}, "zzz": 1}
    errors = catalogue.validate(asset, "synesthetic-asset")
    assert errors == sorted(errors, key=lambda e: (e["path"], e["msg"]))
    assert [e["path"] for e in errors] == [
        "", "/name", "/shader", "/shader", "/shader/uniforms/0", "/shader/uniforms/0/default", "/shader/uniforms/1",
    ]
    assert {"path": "/shader", "msg": "'fragment_shader' is a required property"} in errors
    assert {"path": "/shader", "msg": "'name' is a required property"} in errors
    assert errors.index({"path": "/shader", "msg": "'fragment_shader' is a required property"}) < errors.index(
        {"path": "/shader", "msg": "'name' is a required property"}
    )


def test_missing_or_unknown_schema_fails_with_an_explicit_error(catalogue: SchemaCatalogue) -> None:
    assert catalogue.validate({}, "")[0]["msg"].startswith("schema is required")
    assert catalogue.validate({}, "   ")[0]["msg"].startswith("schema is required")
    assert "unknown schema 'nope'" in catalogue.validate({}, "nope")[0]["msg"]


@pytest.mark.parametrize(
    "path",
    ["../jsonschema/shader.schema.json", "a/../../x.json", "/etc/passwd", "..", "a\\..\\b.json", "x\x00.json", ""],
)
def test_traversal_is_rejected(catalogue: SchemaCatalogue, path: str) -> None:
    with pytest.raises(UnsafePath):
        check_relative_path(path)
    if path:
        with pytest.raises(UnsafePath):
            catalogue.example(path)


def test_traversal_in_a_schema_path_is_refused_as_a_validation_error(catalogue: SchemaCatalogue) -> None:
    [error] = catalogue.validate({}, "../jsonschema/shader.schema.json")
    assert error["msg"].startswith("schema path rejected")


def test_symlinks_leaving_the_root_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "schemas"
    root.mkdir()
    (tmp_path / "secret.json").write_text('{"type": "object"}')
    (root / "leak.schema.json").symlink_to(tmp_path / "secret.json")
    (root / "ok.schema.json").write_text('{"type": "object"}')
    cat = catalogue_from_dirs(str(root))
    assert [s["name"] for s in cat.list_schemas()] == ["ok"]
    assert any("symlink leaves" in p for p in cat.problems)


def test_examples_are_named_by_schema_ref_or_file_name_and_unparsable_ones_skipped(catalogue: SchemaCatalogue) -> None:
    assert catalogue.list_examples() == [
        {"component": "shader", "path": "Shader_Broken.json"},
        {"component": "shader", "path": "Shader_Example.json"},
        {"component": "synesthetic-asset", "path": "SynestheticAsset_Example1.json"},
    ]
    assert catalogue.list_examples("shader") == catalogue.list_examples()[:2]
    assert catalogue.list_examples("tone") == []
    assert any("Truncated_Example.json" in p for p in catalogue.problems)


def test_files_are_read_at_start_only(tmp_path: Path) -> None:
    root = tmp_path / "schemas"
    root.mkdir()
    (root / "a.schema.json").write_text('{"type": "integer"}')
    cat = catalogue_from_dirs(str(root))
    (root / "a.schema.json").write_text('{"type": "string"}')
    (root / "b.schema.json").write_text("{}")
    assert cat.validate(1, "a") == [] and cat.find("b") == (None, False)


def test_schemas_are_never_mutated(catalogue: SchemaCatalogue) -> None:
    before = {s.path: canonical_json(s.schema) for s in catalogue.schemas}
    entry, _ = catalogue.find("synesthetic-asset")
    assert entry is not None
    handed_out = catalogue.schema_copy(entry)
    handed_out["properties"].clear()
    handed_out["required"].append("evil")
    asset = json.loads((EXAMPLES / "SynestheticAsset_Example1.json").read_text())
    for name in ("nested-synesthetic-asset", "synesthetic-asset", "tone", "range", "remote"):
        catalogue.validate(copy.deepcopy(asset), name)
    assert {s.path: canonical_json(s.schema) for s in catalogue.schemas} == before
    for schema_file in SCHEMAS.rglob("*.json"):
        rel = schema_file.relative_to(SCHEMAS).as_posix()
        assert before[rel] == canonical_json(json.loads(schema_file.read_text()))


def test_missing_roots_give_empty_listings(tmp_path: Path) -> None:
    cat = catalogue_from_dirs(str(tmp_path / "none"), str(tmp_path / "none2"))
    assert cat.list_schemas() == [] and cat.list_examples() == []
    assert cat.find("x") == (None, False)


def test_invalid_schema_is_reported_not_raised(tmp_path: Path) -> None:
    root = tmp_path / "schemas"
    root.mkdir()
    (root / "bad.schema.json").write_text('{"type": 12}')
    [error] = catalogue_from_dirs(str(root)).validate({}, "bad")
    assert "not a valid JSON Schema" in error["msg"]


def test_refs_to_files_outside_the_roots_are_refused(tmp_path: Path, no_network: list[Any]) -> None:
    root = tmp_path / "schemas"
    root.mkdir()
    (tmp_path / "outside.schema.json").write_text('{"type": "string"}')
    (root / "escape.schema.json").write_text('{"properties": {"a": {"$ref": "../outside.schema.json"}}}')
    (root / "absolute.schema.json").write_text(
        json.dumps({"properties": {"a": {"$ref": (tmp_path / "outside.schema.json").as_uri()}}})
    )
    cat = catalogue_from_dirs(str(root))
    for name in ("escape", "absolute"):
        [error] = cat.validate({"a": 1}, name)
        assert "remote retrieval is refused" in error["msg"] and "outside.schema.json" in error["msg"]
    assert no_network == []


def test_meta_schema_refs_resolve_offline(tmp_path: Path, no_network: list[Any]) -> None:
    root = tmp_path / "schemas"
    root.mkdir()
    (root / "meta.schema.json").write_text('{"$ref": "https://json-schema.org/draft/2020-12/schema"}')
    cat = catalogue_from_dirs(str(root))
    assert cat.validate({"type": "object"}, "meta") == []
    assert cat.validate({"type": 12}, "meta") != []
    assert no_network == []


def test_repeated_validation_gives_identical_bytes(catalogue: SchemaCatalogue) -> None:
    asset = {"name": 1, "shader": {"uniforms": [{}, {"name": 2}]}, "x": None, "y": None}
    first = canonical_json(catalogue.validate(asset, "synesthetic-asset"))
    for _ in range(5):
        assert canonical_json(catalogue.validate(json.loads(json.dumps(asset)), "synesthetic-asset")) == first
    assert canonical_json(catalogue_from_dirs(str(SCHEMAS)).validate(asset, "synesthetic-asset")) == first
