"""The ``server`` family: ``ccw_info``, a read-only health check.

It says what this process is (version, protocol eras, transports, endpoint, state dir,
selected families) and, over MCP, the roots the client declared.  ``delay_ms`` holds
the answer back for up to 10 s while sending progress notifications every 100 ms: a
real slow request, used to probe pipelining, response order, progress and graceful
shutdown without a helper.  It has no other effect.
"""

from __future__ import annotations

from typing import Any

import trio

from mcp_server import __version__
from mcp_server.tools.registry import ToolContext, ToolSpec

MAX_DELAY_MS = 10_000
_TICK_MS = 100


async def ccw_info(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Describe this server; optionally wait ``delay_ms`` first, reporting progress."""
    delay_ms = int(args.get("delay_ms", 0))
    waited = 0
    while waited < delay_ms:
        step = min(_TICK_MS, delay_ms - waited)
        await trio.sleep(step / 1000)
        waited += step
        await ctx.progress(waited, delay_ms, f"waited {waited} of {delay_ms} ms")
    config = ctx.config
    result: dict[str, Any] = {
        "name": "ccw",
        "version": __version__,
        "protocol_eras": ["2025-11-25", "2026-07-28"],
        "transports": ["stdio", "socket", "http"],
        "endpoint": config.endpoint,
        "state_dir": str(config.state_dir),
        "families": sorted(config.toolsets),
        "roots": await ctx.roots(),
        "delayed_ms": delay_ms,
    }
    if "echo" in args:
        result["echo"] = args["echo"]
    return result


INPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "delay_ms": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_DELAY_MS,
            "description": "wait this long before answering, with progress every 100 ms",
        },
        "echo": {"type": "string", "maxLength": 4096, "description": "returned unchanged (to tell answers apart)"},
    },
    "additionalProperties": False,
}

OUTPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "name": {"const": "ccw"},
        "version": {"type": "string"},
        "protocol_eras": {"type": "array", "items": {"type": "string"}},
        "transports": {"type": "array", "items": {"enum": ["stdio", "socket", "http"]}},
        "endpoint": {"enum": ["stdio", "socket", "http"]},
        "state_dir": {"type": "string"},
        "families": {"type": "array", "items": {"type": "string"}},
        "roots": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"type": "string"}}]},
        "delayed_ms": {"type": "integer", "minimum": 0},
        "echo": {"type": "string"},
    },
    "required": ["name", "version", "protocol_eras", "transports", "endpoint", "state_dir", "families", "roots",
                 "delayed_ms"],
    "additionalProperties": False,
}

TOOLS = [
    ToolSpec(
        name="ccw_info",
        family="server",
        title="ccw server info",
        description="Version, transports, state dir and tool families of this server; a health check.",
        input_schema=INPUT_SCHEMA,
        output_schema=OUTPUT_SCHEMA,
        handler=ccw_info,
        scope="read",
        aliases=("ccw/info", "server.info"),
        read_only=True,
        idempotent=True,
    )
]
