"""A text file beneath an open view (the hashline and RootSpace operations' common ground):
read with errors that say what to call next, and replaced only if nobody wrote it since
it was read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mcp_server.fs.view import RootView
from mcp_server.substrate.views import ChangeNote
from sandbox.errors import CcwError

MAX_READ_CHARS = 2_000_000  # one read stops here and gives next_offset to go on from


@dataclass
class Target:
    """An open view and the file's path beneath it, plus how to name it to the agent;
    in a capsule, how its changes are noted (``note``, with the state dir)."""

    view: RootView
    rel: str
    shown: str
    capsule_id: str | None = None
    state: Any = None
    note: ChangeNote | None = None

    def record(self, action: str, content: bytes | None = None) -> None:
        """Journal a change made inside a capsule, so its witness replays it (live tree: nothing)."""
        if self.capsule_id and self.note is not None:
            self.note(self.state, self.capsule_id, self.view, [self.rel])


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
