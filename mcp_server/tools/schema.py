"""The ``schema`` tool family: seed 001's schema, example, validation, diff and populate tools.

These tools answer with seed 001's own result shapes (``{ok, reason, errors}`` and
friends) as ordinary results, never as ``CcwError``: a failed validation is an answer.

What they serve:

- ``CCW_SCHEMAS_DIR`` (alias ``SYN_SCHEMAS_DIR``) set: every ``*.json`` under it, and
  the examples under ``CCW_EXAMPLES_DIR`` (alias ``SYN_EXAMPLES_DIR``) if that is set.
  Nothing else is mixed in: a public schema set is served as it is.
- unset (the default): ccw's own schemas, built once from what exists at start: the
  input and output schema of every exposed tool (``tool.<name>.input`` /
  ``tool.<name>.output``, virtual paths ``tools/<name>.<input|output>.schema.json``),
  every ``*.json`` under the package's ``mcp_server/schemas/`` (where the policy and
  witness-manifest schemas go once they exist), and ``policies/*.schema.json`` (package
  data, see ``mcp_server.data``).  Examples: each ``examples`` entry of a tool's input schema (one honest
  example call, component ``tool.<name>.input``), the built-in policies
  (``policies/*.json``), and ``CCW_EXAMPLES_DIR`` if set.

The catalogue is built the first time a schema tool (or the server's ``warm``) needs it
and kept for the life of the process: files are read at start only (seed 001 §2).
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import mcp_server
from mcp_server.core.jsonpatch import diff_assets
from mcp_server.core.schema import (
    ExampleEntry,
    SchemaCatalogue,
    SchemaEntry,
    UnsafePath,
    schema_name_of_ref,
)
from mcp_server.fs.policy import policies_dir
from mcp_server.fs.schemafiles import catalogue_from_dirs, read_json_tree
from mcp_server.tools import schema_backend as backend
from mcp_server.tools.registry import ToolContext, ToolSpec

PACKAGE_DIR = Path(mcp_server.__file__).resolve().parent
DEFAULT_SCHEMAS_DIR = PACKAGE_DIR / "schemas"

_catalogues: dict[tuple[str, str, tuple[str, ...]], SchemaCatalogue] = {}
_catalogue_lock = threading.Lock()


# --- the catalogue -------------------------------------------------------------------


def _default_entries(toolsets: tuple[str, ...]) -> tuple[list[SchemaEntry], list[ExampleEntry], list[str]]:
    # Imported here: the registry imports this module to collect TOOLS.
    from mcp_server.tools.registry import Registry

    version = mcp_server.__version__
    schemas: list[SchemaEntry] = []
    examples: list[ExampleEntry] = []
    problems: list[str] = []
    for spec in Registry.load(toolsets).tools:
        for kind, schema in (("input", spec.input_schema), ("output", spec.output_schema)):
            name = f"tool.{spec.name}.{kind}"
            path = f"tools/{spec.name}.{kind}.schema.json"
            schemas.append(SchemaEntry(name, version, path, (DEFAULT_SCHEMAS_DIR / path).as_uri(), schema))
        for index, call in enumerate(spec.input_schema.get("examples", []), start=1):
            name = f"tool.{spec.name}.input"
            examples.append(ExampleEntry(name, f"tools/{spec.name}/example-{index}.json", name, call))
    policies = policies_dir()
    if policies.is_dir():
        documents = list(read_json_tree(policies, problems))
        policy_schemas = [rel for rel, _ in documents if rel.endswith(".schema.json")]
        for rel, document in documents:
            path = f"policies/{rel}"
            if rel in policy_schemas:
                uri = (policies / rel).as_uri()
                name = rel.rsplit("/", 1)[-1].removesuffix(".schema.json")
                schemas.append(SchemaEntry(name, version, path, uri, document))
                continue
            named = schema_name_of_ref(document.get("$schemaRef")) if isinstance(document, dict) else ""
            # Otherwise a document is an example of the one schema in its own directory (policies/
            # holds policy.schema.json; policies/network/ the network presets' schema).
            beside = [s for s in policy_schemas if s.rpartition("/")[0] == rel.rpartition("/")[0]]
            if not named and len(beside) == 1:
                named = beside[0].rsplit("/", 1)[-1].removesuffix(".schema.json")
            examples.append(ExampleEntry(named, path, named, document))
    return schemas, examples, problems


def catalogue(config: Any) -> SchemaCatalogue:
    """The process's catalogue for this configuration, read from disk the first time only."""
    key = (config.schemas_dir, config.examples_dir, tuple(config.toolsets))
    with _catalogue_lock:
        found = _catalogues.get(key)
        if found is not None:
            return found
    if config.schemas_dir:
        built = catalogue_from_dirs(config.schemas_dir, config.examples_dir)
    else:
        schemas, examples, problems = _default_entries(tuple(config.toolsets))
        built = catalogue_from_dirs(
            str(DEFAULT_SCHEMAS_DIR), config.examples_dir, schemas, examples
        )
        built = SchemaCatalogue(
            built.schemas, built.examples, (*problems, *built.problems),
            built.schemas_root, built.examples_root,
        )
    with _catalogue_lock:
        return _catalogues.setdefault(key, built)


def warm(config: Any, log: Any = None) -> SchemaCatalogue:
    """Build the catalogue now (call at server start); report unreadable files to ``log``."""
    built = catalogue(config)
    if log is not None:
        for problem in built.problems:
            log(f"schemas: {problem}")
    return built


def failed(errors: list[dict[str, str]]) -> dict[str, Any]:
    """Seed 001's validation failure shape."""
    return {"ok": False, "reason": "validation_failed", "errors": errors}


def _path_rejected(exc: UnsafePath) -> dict[str, Any]:
    return failed([{"path": "/path", "msg": f"path rejected: {exc}"}])


# --- handlers --------------------------------------------------------------------------


async def list_schemas(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Every schema, sorted by name, version, path."""
    return {"ok": True, "schemas": catalogue(ctx.config).list_schemas()}


async def get_schema(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """One schema by name, ``nested-<name>`` or path relative to the schemas root."""
    cat = catalogue(ctx.config)
    try:
        entry, _nested = cat.find(args["name"])
    except UnsafePath as exc:
        return failed([{"path": "/name", "msg": f"path rejected: {exc}"}])
    if entry is None:
        return {"ok": False, "reason": "not_found"}
    return {"ok": True, "schema": cat.schema_copy(entry), "version": entry.version}


async def list_examples(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Examples of one component, or of all, sorted by component, path."""
    component = args.get("component") or "all"
    return {"ok": True, "examples": catalogue(ctx.config).list_examples(component)}


async def get_example(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """One example by path, validated now against its schema (as a nested asset)."""
    cat = catalogue(ctx.config)
    try:
        entry = cat.example(args["path"])
    except UnsafePath as exc:
        return _path_rejected(exc)
    if entry is None:
        return {"ok": False, "reason": "not_found"}
    example = entry.example
    validated = bool(entry.schema) and not cat.validate(example, "nested-" + entry.schema)
    return {"ok": True, "example": copy.deepcopy(example), "schema": entry.schema, "validated": validated}


async def validate_asset(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Validate one asset against a named schema (required)."""
    errors = catalogue(ctx.config).validate(args.get("asset"), args.get("schema") or "")
    return failed(errors) if errors else {"ok": True}


async def validate_many(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Validate up to MCP_MAX_BATCH assets against one schema."""
    assets = args.get("assets", [])
    limit = ctx.config.max_batch
    if len(assets) > limit:
        return {
            "ok": False,
            "reason": "unsupported",
            "detail": f"batch of {len(assets)} assets exceeds MCP_MAX_BATCH={limit}; split it",
        }
    schema = args.get("schema") or ""
    cat = catalogue(ctx.config)
    if not schema.strip():
        return failed(cat.validate(None, ""))
    results: list[dict[str, Any]] = []
    for asset in assets:
        errors = cat.validate(asset, schema)
        results.append({"ok": False, "errors": errors} if errors else {"ok": True})
    return {"ok": True, "results": results}


async def diff(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """RFC 6902 patch from ``base`` to ``new`` (add/remove/replace, deterministic order)."""
    return {"ok": True, "patch": diff_assets(args["base"], args["new"])}


async def populate_backend(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Validate (unless told not to) and POST one asset to the configured backend."""
    config = ctx.config
    if not config.backend_url:
        return {
            "ok": False,
            "reason": "unsupported",
            "detail": "populate_backend is disabled: set CCW_BACKEND_URL (or SYN_BACKEND_URL)",
        }
    asset = args["asset"]
    if args.get("validate_first", True):
        schema = args.get("schema") or ""
        if not schema and isinstance(asset, dict):
            named = schema_name_of_ref(asset.get("$schemaRef"))
            schema = f"nested-{named}" if named else ""
        if not schema:
            return failed([{"path": "", "msg": "schema is required to validate first: pass schema, "
                                               "or set $schemaRef in the asset"}])
        errors = catalogue(config).validate(asset, schema)
        if errors:
            return failed(errors)
    return await backend.populate(asset, config.backend_url, config.backend_assets_path)


# --- schemas -----------------------------------------------------------------------------

_ERRORS: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["path", "msg"],
        "properties": {"path": {"type": "string"}, "msg": {"type": "string"}},
        "additionalProperties": False,
    },
}
_VALIDATION_FAILED: dict[str, Any] = {
    "type": "object",
    "required": ["ok", "reason", "errors"],
    "properties": {"ok": {"const": False}, "reason": {"const": "validation_failed"}, "errors": _ERRORS},
    "additionalProperties": False,
}
_NOT_FOUND: dict[str, Any] = {
    "type": "object",
    "required": ["ok", "reason"],
    "properties": {"ok": {"const": False}, "reason": {"const": "not_found"}},
    "additionalProperties": False,
}
_UNSUPPORTED: dict[str, Any] = {
    "type": "object",
    "required": ["ok", "reason", "detail"],
    "properties": {"ok": {"const": False}, "reason": {"const": "unsupported"}, "detail": {"type": "string"}},
    "additionalProperties": False,
}
_BACKEND_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["ok", "reason", "status", "detail"],
    "properties": {
        "ok": {"const": False},
        "reason": {"const": "backend_error"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
    },
    "additionalProperties": False,
}
_VALID: dict[str, Any] = {
    "type": "object",
    "required": ["ok"],
    "properties": {"ok": {"const": True}},
    "additionalProperties": False,
}


def _success(**properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["ok", *properties],
        "properties": {"ok": {"const": True}, **properties},
        "additionalProperties": False,
    }


def _one_of(*shapes: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "oneOf": list(shapes)}


def _input(properties: dict[str, Any], required: list[str], examples: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        "examples": examples,
    }


_SCHEMA_ARG = {
    "type": "string",
    "description": "Schema name (see list_schemas), nested-<name>, or a path under the schemas root.",
}
_ANY: dict[str, Any] = {"description": "Any JSON value."}
_PATCH_OP = {
    "type": "object",
    "required": ["op", "path"],
    "properties": {"op": {"enum": ["add", "remove", "replace"]}, "path": {"type": "string"}, "value": _ANY},
    "additionalProperties": False,
}

TOOLS = [
    ToolSpec(
        name="list_schemas",
        family="schema",
        description="List the JSON Schemas served (name, version, path), sorted by name, version, path.",
        input_schema=_input({}, [], [{}]),
        output_schema=_success(
            schemas={
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "version", "path"],
                    "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                                   "path": {"type": "string"}},
                    "additionalProperties": False,
                },
            }
        ),
        handler=list_schemas,
        read_only=True,
        idempotent=True,
        title="List schemas",
    ),
    ToolSpec(
        name="get_schema",
        family="schema",
        description=("Get one JSON Schema by name (or nested-<name>, or path under the schemas root). "
                     "Unknown: reason not_found."),
        input_schema=_input({"name": {"type": "string", "minLength": 1}}, ["name"],
                            [{"name": "tool.diff_assets.input"}]),
        output_schema=_one_of(
            _success(schema={"type": ["object", "boolean"]}, version={"type": "string"}),
            _NOT_FOUND,
            _VALIDATION_FAILED,
        ),
        handler=get_schema,
        read_only=True,
        idempotent=True,
        title="Get schema",
    ),
    ToolSpec(
        name="list_examples",
        family="schema",
        description='List example documents of one component (a schema name) or "all", sorted by component, path.',
        input_schema=_input({"component": {"type": "string", "default": "all"}}, [], [{"component": "all"}]),
        output_schema=_success(
            examples={
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["component", "path"],
                    "properties": {"component": {"type": "string"}, "path": {"type": "string"}},
                    "additionalProperties": False,
                },
            }
        ),
        handler=list_examples,
        read_only=True,
        idempotent=True,
        title="List examples",
    ),
    ToolSpec(
        name="get_example",
        family="schema",
        description=("Get one example by its path (from list_examples), with its schema name and whether it "
                     "validates now."),
        input_schema=_input({"path": {"type": "string", "minLength": 1}}, ["path"],
                            [{"path": "tools/diff_assets/example-1.json"}]),
        output_schema=_one_of(
            _success(example=_ANY, schema={"type": "string"}, validated={"type": "boolean"}),
            _NOT_FOUND,
            _VALIDATION_FAILED,
        ),
        handler=get_example,
        read_only=True,
        idempotent=True,
        title="Get example",
    ),
    ToolSpec(
        name="validate_asset",
        family="schema",
        description=("Validate a JSON asset against a named schema (Draft 2020-12). Errors are RFC 6901 paths "
                     "with messages, sorted. `validate` is a deprecated alias."),
        input_schema=_input(
            {"asset": _ANY, "schema": _SCHEMA_ARG},
            ["asset"],
            [{"asset": {"base": {"a": 1}, "new": {"a": 2}}, "schema": "tool.diff_assets.input"}],
        ),
        output_schema=_one_of(_VALID, _VALIDATION_FAILED),
        handler=validate_asset,
        deprecated_aliases=("validate",),
        read_only=True,
        idempotent=True,
        title="Validate asset",
    ),
    ToolSpec(
        name="validate_many",
        family="schema",
        description=("Validate several assets against one schema; more than MCP_MAX_BATCH assets (default 100) "
                     "is refused as unsupported."),
        input_schema=_input(
            {"assets": {"type": "array", "items": _ANY}, "schema": _SCHEMA_ARG},
            ["assets"],
            [{"assets": [{"name": "tool.list_schemas.input"}, {"name": ""}], "schema": "tool.get_schema.input"}],
        ),
        output_schema=_one_of(
            _success(
                results={
                    "type": "array",
                    "items": {"oneOf": [_VALID, {
                        "type": "object",
                        "required": ["ok", "errors"],
                        "properties": {"ok": {"const": False}, "errors": _ERRORS},
                        "additionalProperties": False,
                    }]},
                }
            ),
            _VALIDATION_FAILED,
            _UNSUPPORTED,
        ),
        handler=validate_many,
        read_only=True,
        idempotent=True,
        title="Validate many",
    ),
    ToolSpec(
        name="diff_assets",
        family="schema",
        description=("RFC 6902 patch (add/remove/replace) from base to new; arrays are replaced whole, "
                     "ops sorted by path."),
        input_schema=_input(
            {"base": _ANY, "new": _ANY},
            ["base", "new"],
            [{"base": {"name": "a", "tags": ["x"]}, "new": {"name": "b", "tags": ["x", "y"], "size": 2}}],
        ),
        output_schema=_success(patch={"type": "array", "items": _PATCH_OP}),
        handler=diff,
        read_only=True,
        idempotent=True,
        title="Diff assets",
    ),
    ToolSpec(
        name="populate_backend",
        family="schema",
        description=("Validate an asset (unless validate_first is false) and POST it to CCW_BACKEND_URL "
                     "(unsupported when unset); one attempt."),
        input_schema=_input(
            {
                "asset": _ANY,
                "validate_first": {"type": "boolean", "default": True},
                "schema": {**_SCHEMA_ARG,
                           "description": "Schema to validate against; default: nested-<the asset's $schemaRef>."},
            },
            ["asset"],
            [],
        ),
        output_schema=_one_of(
            _success(asset_id={"type": "string"}, backend_url={"type": "string"}),
            _VALIDATION_FAILED,
            _BACKEND_ERROR,
            _UNSUPPORTED,
        ),
        handler=populate_backend,
        scope="write",
        title="Populate backend",
    ),
]
