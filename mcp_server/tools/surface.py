"""What ``tools/list`` shows of a tool: its wire form, as small as it can be without losing meaning.

Every tool's list entry is paid for by an agent's context on every turn, so the
advertised form is built here, once per process, from the ``ToolSpec`` (whose own
schemas, the full ones, stay what the server validates against):

- The input schema goes out as written (it is what a model reads to call the tool, and
  some LLM APIs still do not resolve ``$ref`` in tool parameters), less ``$schema`` (MCP's
  default dialect is 2020-12, which every schema here uses), the example calls, which
  the schema tools serve (``get_example``), and size limits no call plans for
  (``maxLength``, ``maxItems``, ``minLength: 1``): the server checks every call against
  the full schema and names the limit a call broke.  A copy of a schema that
  ``get_schema`` serves (policy_set's ``rules``) goes out as its shape and a pointer,
  when ``get_schema`` is listed too.
- The output schema goes out *shallow* (``shallow``): the top-level properties with
  their types (or scalar constants), and the names every result has.  A nested object
  is ``{"type": "object"}``; branches of a top-level ``oneOf`` are merged.  Models read
  the result itself, not its schema; clients that validate ``structuredContent`` (the
  SDK's ClientSession does) only need a schema that is true of every result, and this
  one only drops constraints of the full one, so it is.  The full output schema stays
  the ``ToolSpec``'s, and the server checks every result against it under ``CCW_DEBUG=1``.
- Annotations carry only the hints whose value differs from MCP's defaults
  (readOnlyHint false, destructiveHint true, idempotentHint false, openWorldHint true).

Which tools a connection is shown is its ``ToolList``: the families and profiles of its
``CCW_TOOLSETS``, which is the serving process's own, or, on a connection an attached
``ccw-mcp`` opened (mcp_server/frontdoor.py), that server's.  The list is also what the
connection may call: the server looks every call's name up in it, never in the process's
other tools.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection
from typing import Any

import mcp_types as types

from mcp_server.auth import Principal
from mcp_server.config import Config
from mcp_server.fs.policy import policy_schema
from mcp_server.tools.registry import Registry, ResourceSpec, ToolSpec

# Keywords whose value is one schema, a list of schemas, or a map of name → schema.
_ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties")
_LIST = ("oneOf", "anyOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "dependentSchemas")
_DOC_ONLY = ("description", "title", "examples", "$comment")
# Bounds the server guarantees and a client never needs to re-check in a result it got
# (a capsule id's pattern, a count's minimum); get_schema serves them.
_BOUNDS = ("pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
           "maxLength", "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties")
# Input limits a model never needs to plan for (a path under 4,096 bytes, at most 10,000
# of them); the server still enforces them, answering -32602 with the limit broken.
_SIZE_LIMITS = ("maxLength", "maxItems", "maxProperties")
MCP_HINT_DEFAULTS = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True}


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _map_subschemas(out: dict[str, Any], transform: Callable[[Any], Any]) -> dict[str, Any]:
    """``out`` with ``transform`` applied to each schema it holds one level down (the
    values of _ONE, _LIST and _MAP keywords), in place."""
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = transform(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [transform(c) for c in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {k: transform(c) for k, c in out[key].items()}
    return out


def shape_only(schema: Any) -> Any:
    """``schema`` without documentation and bounds, at every schema position: its shape.

    Every document ``schema`` accepts, the result accepts too (it only drops constraints).
    """
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k not in _DOC_ONLY and k not in _BOUNDS and k != "$schema"}
    if out.get("additionalProperties") is False:  # closedness is a bound too; a map's value schema stays
        del out["additionalProperties"]
    return _map_subschemas(out, shape_only)


_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (type(None), "null"))


def _type_of(value: Any) -> str | None:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), None)


def _union(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary true of every value any of ``summaries`` is true of (``{}`` when none is narrower)."""
    values: list[Any] = []
    for summary in summaries:
        if "const" in summary:
            values.append(summary["const"])
        elif "enum" in summary:
            values.extend(summary["enum"])
        else:
            break
    else:
        unique = list(dict.fromkeys(_dumps(v) for v in values))
        if sorted(unique) == ["false", "true"]:
            return {"type": "boolean"}  # shorter, and the same values
        return {"const": json.loads(unique[0])} if len(unique) == 1 else {"enum": [json.loads(v) for v in unique]}
    types: list[str] = []
    for summary in summaries:
        if "type" in summary:
            found = summary["type"] if isinstance(summary["type"], list) else [summary["type"]]
        else:
            found = [_type_of(v) for v in summary.get("enum", [summary.get("const", ...)])]
        if not found or any(t is None for t in found):
            return {}
        types += [t for t in found if t not in types]
    return {"type": types[0] if len(types) == 1 else types}


def _summary(schema: Any) -> dict[str, Any]:
    """A value's type (or its scalar constant or enum) as ``schema`` states it, and nothing nested."""
    if not isinstance(schema, dict):
        return {}
    if "const" in schema and _type_of(schema["const"]):
        return {"const": schema["const"]}
    if isinstance(schema.get("enum"), list) and all(_type_of(v) for v in schema["enum"]):
        return {"enum": schema["enum"]}
    if "type" in schema:
        return {"type": schema["type"]}
    for key in ("oneOf", "anyOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return _union([_summary(branch) for branch in schema[key]])
    return {}


def _closed(schema: dict[str, Any]) -> bool:
    return schema.get("additionalProperties") is False and not schema.get("patternProperties")


def shallow(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` cut to its top level: each property's type (or scalar constant), required names.

    A nested object is ``{"type": "object"}``, an array ``{"type": "array"}``.  Branches of a
    top-level ``oneOf``/``anyOf`` are merged: a property any branch declares is listed with
    the union of its branches' types (``{}`` when a branch that leaves it out would accept
    anything there), and a name every branch requires is required.  It only drops
    constraints, so every result the full schema accepts, it accepts too.
    """
    out: dict[str, Any] = {}
    if "type" in schema:
        out["type"] = schema["type"]
    properties = {name: _summary(sub) for name, sub in schema.get("properties", {}).items()}
    required = list(schema.get("required", []))
    listed: list[Any] = next((schema[k] for k in ("oneOf", "anyOf") if isinstance(schema.get(k), list)), [])
    branches: list[dict[str, Any]] = [b for b in listed if isinstance(b, dict)]
    if branches:
        names = [n for b in branches for n in b.get("properties", {}) if n not in properties]
        for name in dict.fromkeys(names):
            if any(name not in b.get("properties", {}) and not _closed(b) for b in branches):
                properties[name] = {}
            else:
                properties[name] = _union([_summary(b["properties"][name]) for b in branches
                                           if name in b.get("properties", {})])
        required += [n for n in branches[0].get("required", [])
                     if n not in required and all(n in b.get("required", []) for b in branches[1:])]
        if "type" not in out and all(b.get("type") == "object" for b in branches):
            out["type"] = "object"
    if properties:
        out["properties"] = properties
    if required:
        out["required"] = required
    return out


def _without_size_limits(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k not in _SIZE_LIMITS and not (k == "minLength" and v == 1)}
    return _map_subschemas(out, _without_size_limits)


def _documented_elsewhere(schema: Any) -> Any:
    """``schema`` with every copy of a schema that ``get_schema`` serves cut to its shape and a pointer.

    policy_set's ``rules`` are the policy schema's rules, a paragraph each: a model that
    needs more than the names and types asks ``get_schema`` once, instead of every
    agent paying for the paragraphs on every turn.
    """
    if not isinstance(schema, dict):
        return schema
    for served, pointer in _served_by_get_schema():
        if schema.get("properties") == _without_size_limits(served).get("properties"):
            return {**shape_only(schema), "description": pointer}
    out = dict(schema)
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {k: _documented_elsewhere(c) for k, c in out[key].items()}
    return out


def _served_by_get_schema() -> list[tuple[dict[str, Any], str]]:
    return [(policy_schema()["$defs"]["rules"], 'Each rule is documented by get_schema {"name": "policy"}.')]


def advertised_input_schema(spec: ToolSpec, beside: Collection[str] = ()) -> dict[str, Any]:
    """The input schema ``tools/list`` shows for ``spec`` (module docstring), listed with the tools ``beside``.

    A schema ``get_schema`` serves is cut to a pointer only when ``get_schema`` is among them.
    """
    schema = {key: value for key, value in spec.input_schema.items()
              if key not in ("$schema", "examples") and not (key == "required" and value == [])}
    schema = _without_size_limits(schema)
    return _documented_elsewhere(schema) if "get_schema" in beside else schema


def advertised_output_schema(spec: ToolSpec) -> dict[str, Any]:
    """The output schema ``tools/list`` shows for ``spec`` (module docstring)."""
    return shallow(spec.output_schema)


def advertised_annotations(spec: ToolSpec) -> dict[str, Any]:
    """The tool's MCP annotations, keeping only hints that differ from MCP's defaults."""
    hints: dict[str, Any] = {"readOnlyHint": spec.read_only, "openWorldHint": False}
    if not spec.read_only:  # MCP: the other two mean something only for tools that write
        hints.update(destructiveHint=spec.destructive, idempotentHint=spec.idempotent)
    return {key: value for key, value in hints.items() if MCP_HINT_DEFAULTS[key] != value}


class ToolList:
    """The tools one connection is served: a selection of the process's registry, by the
    families and profiles of a ``CCW_TOOLSETS``, with its ``tools/list`` answer."""

    def __init__(self, config: Config, toolsets: Collection[str], servable: Registry) -> None:
        chosen = tuple(sorted(set(toolsets)))
        self.registry = servable.select(chosen)
        self.names = frozenset(spec.name for spec in self.registry.tools)
        # The server's settings as this connection's calls see them: with its own families,
        # which ccw_info reports and the schema tools' catalogue lists.
        same = set(config.toolsets) == set(chosen)
        self.config = config if same else dataclasses.replace(config, toolsets=chosen)
        self._listed: list[types.Tool] | None = None

    def listed(self) -> list[types.Tool]:
        """The ``tools/list`` answer, built on the first ask: the advertised schemas cost time."""
        if self._listed is None:
            self._listed = [
                types.Tool(
                    name=spec.name,
                    title=spec.title or None,
                    description=spec.description,
                    input_schema=advertised_input_schema(spec, beside=self.names),
                    output_schema=advertised_output_schema(spec),
                    annotations=types.ToolAnnotations.model_validate(advertised_annotations(spec)),
                )
                for spec in self.registry.tools
            ]
        return self._listed

    def listed_to(self, scopes: frozenset[str]) -> list[types.Tool]:
        """The ``tools/list`` answer for an HTTP token of ``scopes``: the tools some call of which it may make."""
        principal = Principal("", scopes)
        return [tool for tool, spec in zip(self.listed(), self.registry.tools, strict=True)
                if any(principal.grants(scope) for scope in spec.scopes)]

    def resources_to(self, scopes: frozenset[str] | None) -> list[ResourceSpec]:
        """The resources (and templates) an HTTP token of ``scopes`` may read; every one without a token."""
        if scopes is None:
            return list(self.registry.resources)
        principal = Principal("", scopes)
        return [resource for resource in self.registry.resources if principal.grants(resource.scope)]
