"""The stdio transport: NDJSON on stdin/stdout, logs on stderr, exit when stdin closes.

Some facts about keeping stdout clean.  Anything that writes to file descriptor 1
corrupts the frame stream: a stray ``print``, a C library's warning, and above all a
child process (the embedded helper, a tool's subprocess), which inherits fd 1.  So
before serving, the transport moves the real stdin and stdout to private descriptors
above 2 (close-on-exec, so no child inherits them), then points fd 0 at /dev/null and
fd 1 at stderr.  From then on only this module can write a frame, and whatever
anything else prints lands in the log.  (The SDK's own stdio server does the same.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator

import trio

from mcp_server.server import CcwServer
from mcp_server.transports.ndjson import NdjsonConnection


@contextlib.contextmanager
def claim_stdio() -> Iterator[tuple[int, int]]:
    """Yield private (stdin, stdout) descriptors; fds 0 and 1 are diverted meanwhile."""
    sys.stdout.flush()
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    saved_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    saved_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        yield wire_in, wire_out
    finally:
        os.close(null)
        sys.stdout.flush()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


async def serve(app: CcwServer, draining: trio.Event, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve one NDJSON session on stdin/stdout until stdin closes (or drain completes)."""
    with claim_stdio() as (wire_in, wire_out):
        reader = trio.lowlevel.FdStream(wire_in)
        writer = trio.lowlevel.FdStream(wire_out)
        async with reader, writer:
            task_status.started("-")
            await NdjsonConnection(app, reader, writer, draining).run()
