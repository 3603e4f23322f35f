"""What ``tools/list`` shows of a tool: its wire form, as small as it can be without losing meaning.

Every tool's list entry is paid for by an agent's context on every turn, so the
advertised form is built here, once per process, from the ``ToolSpec``:

- The input schema goes out as written (it is what a model reads to call the tool, and
  some LLM APIs still do not resolve ``$ref`` in tool parameters), less ``$schema`` (MCP's
  default dialect is 2020-12, which every schema here uses), the example calls, which
  the schema tools serve (``get_example``), and size limits no call plans for
  (``maxLength``, ``maxItems``, ``minLength: 1``): the server checks every call against
  the full schema and names the limit a call broke.
- The output schema goes out *factored*: what every ``oneOf`` branch says alike is said
  once beside it (``hoist``), then every subschema that occurs more than once
  (the branches of a ``oneOf`` repeat most of their properties, a fingerprint or a
  usage object appears in several places) is written once under ``$defs`` and referred
  to with ``$ref``; and it keeps only the shape (``shape_only``): types, properties,
  required names, enums and consts.  Documentation (``description``, ``examples``) and
  bounds (``pattern``, ``minimum``, ``maxLength``, ``additionalProperties: false``…) stay out: clients check a result's
  shape, models read the result itself, and the server guarantees the bounds (it checks
  every result against the full schema under ``CCW_DEBUG=1``).  Every result the full
  schema accepts, the advertised one accepts too (tests/test_tool_surface.py).
  ``get_schema`` still serves the schema as written.
- Annotations carry only the hints whose value differs from MCP's defaults
  (readOnlyHint false, destructiveHint true, idempotentHint false, openWorldHint true).
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

from mcp_server.tools.registry import ToolSpec

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
# A $ref costs about this many bytes ({"$ref":"#/$defs/x"}); only subschemas that save
# more than that by being written once are factored.
_REF_COST = 24
MCP_HINT_DEFAULTS = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True}


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _subschemas(schema: Any, name: str = "") -> Iterator[tuple[dict[str, Any], str]]:
    """(subschema, the property name it sits under or '') for every schema position below ``schema``."""
    if not isinstance(schema, dict):
        return
    for key in _ONE:
        child = schema.get(key)
        if isinstance(child, dict):
            yield child, name if key == "items" else key
            yield from _subschemas(child, name)
    for key in _LIST:
        for child in schema.get(key, []) if isinstance(schema.get(key), list) else []:
            if isinstance(child, dict):
                yield child, name
                yield from _subschemas(child, name)
    for key in _MAP:
        children = schema.get(key)
        if isinstance(children, dict):
            for child_name, child in children.items():
                if isinstance(child, dict):
                    yield child, child_name
                    yield from _subschemas(child, child_name)


def _replace(schema: Any, text: str, ref: dict[str, str]) -> Any:
    """``schema`` with every schema position whose canonical text is ``text`` replaced by ``ref``."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = ref if _dumps(out[key]) == text else _replace(out[key], text, ref)
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [ref if isinstance(c, dict) and _dumps(c) == text else _replace(c, text, ref) for c in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {k: ref if isinstance(c, dict) and _dumps(c) == text else _replace(c, text, ref)
                        for k, c in out[key].items()}
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
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = shape_only(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [shape_only(c) for c in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {k: shape_only(c) for k, c in out[key].items()}
    return out


_CLOSED = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def hoist(schema: Any) -> Any:
    """``schema`` with what every ``oneOf`` branch says alike said once, beside the ``oneOf``.

    A property whose subschema is the same in every branch, and a name every branch
    requires, move to the parent; a branch's ``type`` that repeats the parent's goes.  The same documents validate: each branch still sees
    the property checked (by the parent), so no branch starts or stops matching.  Not
    done when a branch closes its object (``additionalProperties`` and friends), where
    taking a property out of ``properties`` would forbid it.
    """
    if not isinstance(schema, dict):
        return schema
    out = {k: ([hoist(c) for c in v] if k in _LIST and isinstance(v, list) else
               {n: hoist(c) for n, c in v.items()} if k in _MAP and isinstance(v, dict) else
               hoist(v) if k in _ONE else v) for k, v in schema.items()}
    branches = out.get("oneOf")
    if (not isinstance(branches, list) or len(branches) < 2 or "properties" in out or "required" in out
            or not all(isinstance(b, dict) and isinstance(b.get("properties"), dict) for b in branches)
            or any(key in b for b in branches for key in _CLOSED)):
        return out
    first = branches[0]["properties"]
    shared = {name: sub for name, sub in first.items()
              if all(_dumps(b["properties"].get(name)) == _dumps(sub) for b in branches[1:])}
    required = [name for name in branches[0].get("required", [])
                if all(name in b.get("required", []) for b in branches[1:])]
    if not shared and not required:
        return out
    out["properties"] = shared
    if required:
        out["required"] = required
    trimmed = []
    for branch in branches:
        branch = dict(branch)
        if "type" in out and branch.get("type") == out["type"]:
            del branch["type"]  # said by the parent already
        branch["properties"] = {n: sub for n, sub in branch["properties"].items() if n not in shared}
        rest = [name for name in branch.get("required", []) if name not in required]
        if rest:
            branch["required"] = rest
        else:
            branch.pop("required", None)
        if not branch["properties"]:
            del branch["properties"]
        trimmed.append(branch)
    out["oneOf"] = trimmed
    return out


def factor(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with each repeated subschema moved to ``$defs`` once, largest saving first."""
    if "$defs" in schema or "$ref" in _dumps(schema):
        return schema  # already uses references: left as its author wrote it
    result = copy.deepcopy(schema)
    defs: dict[str, Any] = {}
    while True:
        counts: Counter[str] = Counter()
        names: dict[str, str] = {}
        for subschema, name in _subschemas({"properties": {"": result}, "$defs": defs}):
            text = _dumps(subschema)
            counts[text] += 1
            names.setdefault(text, name)
        # Written once under $defs instead of `count` times, plus a $ref per occurrence.
        savings = [((count - 1) * len(text) - count * _REF_COST - len(names[text]), text)
                   for text, count in counts.items() if count > 1]
        best = max(savings) if savings else None
        if best is None or best[0] <= 0:
            break
        text = best[1]
        base = (names[text] or "part").replace("/", "_").replace("~", "_")
        name, n = base, 2
        while name in defs:
            name, n = f"{base}{n}", n + 1
        ref = {"$ref": f"#/$defs/{name}"}
        result = _replace(result, text, ref)
        defs = {k: _replace(v, text, ref) for k, v in defs.items()}
        defs[name] = json.loads(text)
    if defs:
        result["$defs"] = dict(sorted(defs.items()))
    return result


def _without_size_limits(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k not in _SIZE_LIMITS and not (k == "minLength" and v == 1)}
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = _without_size_limits(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [_without_size_limits(c) for c in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {k: _without_size_limits(c) for k, c in out[key].items()}
    return out


def advertised_input_schema(spec: ToolSpec) -> dict[str, Any]:
    """The input schema ``tools/list`` shows for ``spec`` (module docstring)."""
    schema = {key: value for key, value in spec.input_schema.items() if key not in ("$schema", "examples")}
    return _without_size_limits(schema)


def advertised_output_schema(spec: ToolSpec) -> dict[str, Any]:
    """The output schema ``tools/list`` shows for ``spec`` (module docstring)."""
    return factor(hoist(shape_only(spec.output_schema)))


def advertised_annotations(spec: ToolSpec) -> dict[str, Any]:
    """The tool's MCP annotations, keeping only hints that differ from MCP's defaults."""
    hints: dict[str, Any] = {"readOnlyHint": spec.read_only, "openWorldHint": False}
    if not spec.read_only:  # MCP: the other two mean something only for tools that write
        hints.update(destructiveHint=spec.destructive, idempotentHint=spec.idempotent)
    return {key: value for key, value in hints.items() if MCP_HINT_DEFAULTS[key] != value}
