"""``completion/complete``: values for the ``list://{+path}`` template's path and for the tool
arguments that name what the server keeps (capsule ids, policy names, witness ids).

MCP's references name a prompt (``ref/prompt``) or a resource template (``ref/resource``);
neither revision (2025-06-18, 2025-11-25) has a tool reference.  ccw serves no prompts, so
a ``ref/prompt`` whose name is a tool of the connection completes that tool's argument: a
client filling in a tool call's form asks that way.  An unknown name or template, or an
argument the tool does not take, is a JSON-RPC -32602 naming what exists.

The values come from what the connection could ask for itself, through the same pipeline
as ``tools/call``: ``capsule_list``, ``policy_list`` and ``witness_list`` (so a caller sees
only its own capsules, as there), and the ``list://`` resource for the directories under a
path.  A source the connection is not served completes to nothing.  At most 100 values,
sorted, the spec's cap: ``total`` and ``hasMore`` say when there were more.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import quote

import mcp_types as types
from mcp.shared.exceptions import MCPError

from mcp_server.context import CallContext
from mcp_server.tools.registry import ResourceSpec, ToolSpec
from mcp_server.tools.surface import ToolList
from sandbox.errors import CcwError

MAX_VALUES = 100  # the spec's cap on one answer

# What names a thing, by kind: the list tool that lists it, the result's array, the item's key.
_SOURCES = {
    "capsule": ("capsule_list", "capsules", "capsule_id"),
    "policy": ("policy_list", "policies", "name"),
    "witness": ("witness_list", "witnesses", "witness_id"),
}
# Tool arguments that take one of those, by name (a policy tool's ``name`` is a policy's).
_ARGUMENTS = {"capsule_id": "capsule", "capsule_ids": "capsule",
              "policy": "policy", "policies": "policy", "witness_id": "witness"}



class Pipeline(Protocol):
    """The server's tool pipeline (mcp_server/server.py): validation, the handler, the checks."""

    async def call_tool(self, spec: ToolSpec, args: dict[str, Any], ctx: CallContext) -> dict[str, Any]: ...


async def complete(pipeline: Pipeline, tools: ToolList, call: CallContext,
                   params: types.CompleteRequestParams) -> types.CompleteResult:
    """The completion of ``params`` among the tools and resources of ``tools``, asked with ``call``."""
    name, value = params.argument.name, params.argument.value
    source = _Source(pipeline, tools, call)
    if isinstance(params.ref, types.ResourceTemplateReference):
        candidates = await _resource_values(source, params.ref.uri, name, value)
    else:
        candidates = await _tool_values(source, params.ref.name, name)
    matching = sorted({c for c in candidates if c.startswith(value)})
    return types.CompleteResult(completion=types.Completion(
        values=matching[:MAX_VALUES], total=len(matching), has_more=len(matching) > MAX_VALUES))


class _Source:
    """What the connection could ask for itself: its tools and resources, called as it would."""

    def __init__(self, pipeline: Pipeline, tools: ToolList, call: CallContext) -> None:
        self.pipeline, self.registry, self.call = pipeline, tools.registry, call

    async def tool(self, name: str) -> dict[str, Any] | None:
        """``name``'s result without arguments; None when not served here or it failed."""
        spec = self.registry.lookup(name)
        try:
            return None if spec is None else await self.pipeline.call_tool(spec, {}, self.call)
        except CcwError:
            return None

    async def read(self, resource: ResourceSpec, uri: str) -> str | None:
        """The text of ``uri``; None when there is nothing there (a directory that does not exist)."""
        try:
            return (await resource.handler(self.call, uri))[1]
        except CcwError:
            return None


async def _tool_values(source: _Source, tool: str, argument: str) -> list[str]:
    spec = source.registry.lookup(tool)
    if spec is None:
        raise MCPError(code=types.INVALID_PARAMS, message=(
            f"completion/complete: no prompt or tool named {tool!r}; ccw serves no prompts, and a "
            "ref/prompt names a tool of tools/list"))
    if argument not in _properties(spec.input_schema):
        raise MCPError(code=types.INVALID_PARAMS, message=(
            f"completion/complete: {spec.name} takes no argument {argument!r}; its arguments: "
            + ", ".join(sorted(_properties(spec.input_schema)))))
    kind = "policy" if spec.family == "policy" and argument == "name" else _ARGUMENTS.get(argument)
    if kind is None:
        return []  # free text (a command, a path in a capsule): nothing the server keeps names it
    lister, array, key = _SOURCES[kind]
    result = await source.tool(lister)
    return [] if result is None else [str(item[key]) for item in result.get(array, [])]


async def _resource_values(source: _Source, template: str, argument: str, value: str) -> list[str]:
    resources = {r.uri_template: r for r in source.registry.resources}
    if template not in resources:
        raise MCPError(code=types.INVALID_PARAMS, message=(
            f"completion/complete: no resource template {template!r}; resources/templates/list shows: "
            + ", ".join(resources)))
    if template != "list://{+path}" or argument != "path":
        raise MCPError(code=types.INVALID_PARAMS, message=(
            f"completion/complete: {template} has no argument {argument!r} to complete"))
    # The directories in the one the value has reached: "src/ma" lists src/ for names from "ma".
    parent = value[: value.rfind("/") + 1]
    text = await source.read(resources[template], "list://" + quote(parent, safe="/"))
    listing = json.loads(text) if text is not None else {"entries": []}
    return [f"{parent}{entry['name']}/" for entry in listing["entries"] if entry["kind"] == "dir"]


def _properties(schema: Mapping[str, Any]) -> set[str]:
    """The argument names a tool's input schema takes, its alternatives' (oneOf, anyOf) too."""
    names = set(schema.get("properties", {}))
    for branch in (*schema.get("oneOf", ()), *schema.get("anyOf", ())):
        names |= _properties(branch)
    return names
