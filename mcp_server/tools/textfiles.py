"""The text tools' shared plumbing (hashline: ``mcp_server/tools/hashline.py``, RootSpace:
``mcp_server/tools/rootspace.py``): a file beneath an open view, read with errors that say
what to call next, and replaced only if nobody wrote it since it was read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import trio

from mcp_server.fs.view import RootView
from mcp_server.tools.registry import ToolContext
from sandbox.errors import CcwError

MAX_READ_CHARS = 2_000_000  # one read stops here and gives next_offset to go on from


@dataclass
class Target:
    """An open view and the file's path beneath it, plus how to name it to the agent."""

    view: RootView
    rel: str
    shown: str
    capsule_id: str | None = None
    state: Any = None

    def record(self, action: str, content: bytes | None = None) -> None:
        """Journal a change made inside a capsule, so its witness replays it (live tree: nothing)."""
        if self.capsule_id:
            from mcp_server.capsules.notes import note_tool_changes

            note_tool_changes(self.state, self.capsule_id, self.view, [self.rel])


def file_identity(view: RootView, rel: str) -> tuple[int, ...]:
    """What changes when anyone writes the file: inode, size, mtime, ctime."""
    st = view.stat(rel, follow=True)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@contextlib.contextmanager
def missing_means(shown: str, message: str) -> Iterator[None]:
    """Turn a NOT_FOUND raised in the block into one whose ``message`` says what to call next."""
    try:
        yield
    except CcwError as exc:
        if exc.code != "NOT_FOUND":
            raise
        raise CcwError("NOT_FOUND", message, {"path": shown}) from exc


def read_file(view: RootView, rel: str, shown: str, next_call: str) -> bytes:
    """A file's bytes, with errors that say what to call next."""
    if rel == "":
        raise CcwError("INVALID_ARGUMENT", f"{shown} is a directory; give the path of a file in it.", {"path": shown})
    try:
        return view.read_bytes(rel)
    except CcwError as exc:
        if exc.code == "NOT_FOUND":
            raise CcwError(
                "NOT_FOUND",
                f"{shown} does not exist; check the path ({next_call}).",
                {**exc.details, "path": shown},
            ) from exc
        if "not a regular file" in exc.message:
            raise CcwError(
                "INVALID_ARGUMENT",
                f"{shown} is not a regular file (a directory?); give the path of a file.",
                {**exc.details, "path": shown},
            ) from exc
        raise


def write_checked(found: Target, before: tuple[int, ...], data: bytes, reread: str) -> None:
    """Replace the file atomically unless someone wrote it since ``before`` was taken."""
    if file_identity(found.view, found.rel) != before:
        raise CcwError(
            "CONFLICT",
            f"{found.shown} was changed by another writer while this edit was being applied; "
            f"nothing was written. {reread}",
            {"path": found.shown, "reason": "concurrent_write"},
        )
    found.view.write_bytes(found.rel, data)
    found.record("write", data)


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
