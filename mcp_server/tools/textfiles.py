"""The text tools' shared adapter plumbing (hashline: ``mcp_server/tools/hashline.py``,
RootSpace: ``mcp_server/tools/rootspace.py``): resolve the call's path to an open view,
run the substrate service (``mcp_server/substrate/textfiles.py`` and its users) on it in
a worker thread, close the view.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from mcp_server.substrate.textfiles import Target
from mcp_server.tools.registry import ToolContext

Resolver = Callable[[ToolContext, str, str | None], Awaitable[Target]]


def with_view(resolve: Resolver) -> Callable[[Callable[[Target, dict[str, Any]], dict[str, Any]]], Any]:
    """Make a handler: resolve the path to an open view, run the body in a worker thread
    (file reads, tagging and writes block), close the view."""

    def wrap(run: Callable[[Target, dict[str, Any]], dict[str, Any]]) -> Any:
        async def handler(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
            found = await resolve(ctx, args["path"], args.get("capsule_id"))
            try:
                return await trio.to_thread.run_sync(run, found, args)
            finally:
                found.view.close()

        handler.__doc__ = run.__doc__
        return handler

    return wrap
