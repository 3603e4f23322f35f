"""The stdio transport: NDJSON on stdin/stdout, logs on stderr, exit when stdin closes.

Some facts about keeping stdout clean.  Anything that writes to file descriptor 1
corrupts the frame stream: a stray ``print``, a C library's warning, and above all a
child process (the embedded helper, a tool's subprocess), which inherits fd 1.  So
before serving, the transport moves the real stdin and stdout to private descriptors
above 2 (close-on-exec, so no child inherits them), then points fd 0 at /dev/null and
fd 1 at stderr.  From then on only this module can write a frame, and whatever
anything else prints lands in the log.  (The SDK's own stdio server does the same.)

A pipe holds 64 KiB by default, so a large answer (a whole file read back) leaves in
many small writes, each waiting for the client to drain the last; a client that
re-joins its buffer on every read it makes (the SDK's stdio client does) then pays for
each piece.  The output pipe is enlarged to PIPE_SIZE (1 MiB, the most an unprivileged
process may ask for), when stdout is a pipe at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator

import trio

from mcp_server.caller import CALLER_TRUSTED
from mcp_server.server import CcwServer
from mcp_server.transports.ndjson import NdjsonConnection

PIPE_SIZE = 1 << 20  # /proc/sys/fs/pipe-max-size's default


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


async def serve(app: CcwServer, draining: trio.Event,
                task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve one NDJSON session on stdin/stdout until stdin closes (or drain completes)."""
    with claim_stdio() as (wire_in, wire_out):
        with contextlib.suppress(OSError):  # not a pipe, or a lower pipe-max-size: keep what it is
            fcntl.fcntl(wire_out, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        reader = trio.lowlevel.FdStream(wire_in)
        writer = trio.lowlevel.FdStream(wire_out)
        async with reader, writer:
            task_status.started("-")
            CALLER_TRUSTED.set(True)  # whoever started us: our own uid
            await NdjsonConnection(app, reader, writer, draining).run()
