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
from sandbox.errors import CcwError

Resolver = Callable[[ToolContext, str, str | None], Awaitable[Target]]


def with_view(resolve: Resolver) -> Callable[[Callable[[Target, dict[str, Any]], dict[str, Any]]], Any]:
    """Make a handler: resolve the path to an open view, run the body in a worker thread
    (file reads, tagging and writes block), close the view."""

    def wrap(run: Callable[[Target, dict[str, Any]], dict[str, Any]]) -> Any:
        async def handler(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
            found = await resolve(ctx, args["path"], args.get("capsule_id"))
            try:
                return await trio.to_thread.run_sync(run, found, args)
            except CcwError as exc:
                if args.get("capsule_id") and exc.details.get("errno") == "EROFS":
                    raise _held(args["capsule_id"], exc) from exc
                raise
            finally:
                found.view.close()

        handler.__doc__ = run.__doc__
        return handler

    return wrap


def _held(capsule_id: str, exc: CcwError) -> CcwError:
    """A write refused because the helper remounted the capsule's view read-only: it is a lower layer
    of a fork or of a merged capsule (sandbox/fork_layers.py holds it), which that layer must not change under."""
    return CcwError("CONFLICT", f"capsule {capsule_id} is read-only while forks or merged capsules are stacked on it "
                    f"({exc.message}); write in a fork of it, or destroy those capsules first",
                    {**exc.details, "capsule_id": capsule_id})
