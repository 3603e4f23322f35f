"""What a caller lends a call: its environment, its workspace and its terminal.

A client that runs as our own uid may lend the front end what an in-process run would
have taken from its own process: the ``ccw`` command sends, with each call,
``_meta["ccw/caller"]`` (cwd, environment; capsule_create's toolchain discovery reads PATH
and HOME, a capsule's commands the values of its whitelisted variables), and an attached
``ccw-mcp`` lends the same once for its whole connection, with its CCW_WORKSPACE, as its
opening line (mcp_server/frontdoor.py).  ``ccw capsule shell`` also sends its pty slave
(SCM_RIGHTS on frontend.sock) with its ``capsule_exec`` call, which says so in
``_meta["ccw/terminal"]``.

Only a connection known to be our own uid may lend anything: stdio (whoever started us)
and the state dir's frontend.sock (peer-checked).  Their transports say so in
``CALLER_TRUSTED``, and set ``CALLER_CONTEXT`` and ``PASSED_FDS`` for the connection's
tasks; HTTP and a configured MCP socket lend nothing, whatever ``_meta`` says.

What a call was lent is decided once, by the server (mcp_server/server.py), through
``lent`` and ``lending``: a ``Caller``, which the call's ToolContext carries (context.py)
and tools read as typed fields (``caller_env``, ``caller_lent``, ``terminal``, ``workspace``).
Where nothing was lent, this process's environment stands in: a stdio client started us,
so ours is its, and over HTTP there is no other to take.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any

from sandbox.errors import CcwError

# True on a connection whose client is known to run as our own uid and may so lend us its
# environment (stdio; the state dir's frontend.sock, peer-checked: mcp_server/frontdoor.py).
# Set by the transport for the connection's tasks; unset (False) elsewhere.
CALLER_TRUSTED: contextvars.ContextVar[bool] = contextvars.ContextVar("ccw_caller_trusted", default=False)
# params._meta key: {"cwd": ..., "env": {the calling process's environment}, "workspace": its
# CCW_WORKSPACE (an attached ccw-mcp's: transports/relay.py)}.
CALLER_META = "ccw/caller"


# What a client lent for its whole connection (an attached ccw-mcp's opening line on
# frontend.sock: mcp_server/frontdoor.py), for the calls that lend nothing themselves.
CALLER_CONTEXT: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar("ccw_caller", default=None)


def _caller(meta: Any) -> Mapping[str, Any] | None:
    """The caller context of a trusted call: its own ``_meta["ccw/caller"]``, else its connection's."""
    if not CALLER_TRUSTED.get():
        return None
    caller = meta.get(CALLER_META) if isinstance(meta, Mapping) else None
    caller = caller if caller is not None else CALLER_CONTEXT.get()
    return caller if isinstance(caller, Mapping) else None


def caller_env(meta: Any) -> dict[str, str] | None:
    """The environment a trusted call lends under ``_meta["ccw/caller"]`` or its connection
    lent (the ccw command's, an attached ccw-mcp's: PATH and HOME for toolchain discovery,
    the values of a capsule's whitelisted variables for its commands), else None."""
    caller = _caller(meta)
    env = caller.get("env") if caller is not None else None
    if not isinstance(env, Mapping):
        return None
    return {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)}


CALLER_TERMINAL = "ccw/terminal"  # params._meta key: true when the call came with a terminal (SCM_RIGHTS)
# params._meta key: true when the caller wants an exec's output as it comes (the ccw command
# prints it): each progress notification then carries what came since the last under the
# same key of its own _meta, {"stdout"|"stderr": {"at": offset, "data": base64}}
# (context.py ``CallContext.progress``).  It asks nothing of the caller's trust.
CALLER_OUTPUT = "ccw/output"


class PassedFds:
    """The descriptors a client passed on one connection (SCM_RIGHTS), in arrival order,
    each kept until a call takes it, and closed when the connection ends."""

    LIMIT = 4  # more waiting than any honest client sends (one per shell call): the rest are closed

    def __init__(self) -> None:
        self._fds: collections.deque[int] = collections.deque()

    def add(self, fds: list[int]) -> None:
        """Keep ``fds`` (ours now) for the calls that name them; close those over the limit."""
        for fd in fds:
            if len(self._fds) < self.LIMIT:
                self._fds.append(fd)
            else:
                os.close(fd)

    def take(self) -> int | None:
        """The oldest descriptor not yet taken (the caller's to close), or None."""
        return self._fds.popleft() if self._fds else None

    def close(self) -> None:
        """Close those no call took."""
        while self._fds:
            os.close(self._fds.popleft())


# The descriptors passed on this connection: set only by the state dir's frontend.sock
# (peer-checked to be our own uid, mcp_server/frontdoor.py), where ``ccw capsule shell``
# sends its terminal with its call; None elsewhere (no other transport carries any).
PASSED_FDS: contextvars.ContextVar[PassedFds | None] = contextvars.ContextVar("ccw_passed_fds", default=None)


def caller_terminal(meta: Any, tool: str) -> int | None:
    """The terminal a call came with (``_meta["ccw/terminal"]``: a pty slave passed with the
    request on frontend.sock), now the caller's of this function to close; None if it
    names none.  INVALID_ARGUMENT when it names one that did not come, or on another tool."""
    if not isinstance(meta, Mapping) or meta.get(CALLER_TERMINAL) is not True:
        return None
    passed = PASSED_FDS.get()
    fd = passed.take() if passed is not None else None
    if fd is None:
        raise CcwError("INVALID_ARGUMENT", (
            "this call names a terminal but none came with it: only `ccw capsule shell` passes one, "
            "with its call, on the state dir's frontend.sock; call without _meta[\"ccw/terminal\"]"))
    if tool != "capsule_exec":
        os.close(fd)
        raise CcwError("INVALID_ARGUMENT", f"{tool} takes no terminal (only capsule_exec runs on one)")
    return fd


def caller_workspace(meta: Any) -> str | None:
    """The workspace root an attached ``ccw-mcp`` lends with each call (its own CCW_WORKSPACE,
    by default its cwd: the file tools' root when its client declares no roots), if the
    call is trusted and names an absolute one; else None (ours applies)."""
    caller = _caller(meta)
    workspace = caller.get("workspace") if caller is not None else None
    return workspace if isinstance(workspace, str) and os.path.isabs(workspace) else None


@dataclasses.dataclass(frozen=True)
class Caller:
    """What one call was lent, as its ToolContext carries it (mcp_server/context.py)."""

    lent_env: Mapping[str, str] | None = None  # the caller's environment, when it lent one (``caller_env``)
    workspace: str | None = None  # its absolute CCW_WORKSPACE, when lent (``caller_workspace``); None: ours
    terminal: int | None = None  # the pty slave it passed (``caller_terminal``), open while the call lasts
    output_token: Any = None  # its progress token, when it asked for an exec's output as it comes (CALLER_OUTPUT)

    @property
    def env(self) -> Mapping[str, str]:
        """The caller's environment: the one it lent, else this process's own.  That default is
        decided here alone: a call's tools read it through their ToolContext, and the capsule
        service (capsules/exec.py ``whitelisted``, the TERM of an exec on a terminal) asks
        ``Caller(values).env`` for work that may have nothing lent (a service's restart, a
        remote trial, a replay)."""
        return self.lent_env if self.lent_env is not None else os.environ


NOTHING_LENT = Caller()  # a call no client lent anything: ours stands in (an in-process call, a test)


def lent(meta: Any) -> Caller:
    """What a call lends but a terminal (direct methods, resource reads, completion take none)."""
    return Caller(caller_env(meta), caller_workspace(meta), output_token=output_token(meta))


def output_token(meta: Any) -> Any:
    """The progress token whose notifications are to carry an exec's output (CALLER_OUTPUT), or None."""
    if not isinstance(meta, Mapping) or meta.get(CALLER_OUTPUT) is not True:
        return None
    return meta.get("progress_token", meta.get("progressToken"))


@contextlib.contextmanager
def lending(meta: Any, tool: str) -> Iterator[Caller]:
    """What a call of ``tool`` lends, its terminal included, for the block; the terminal is
    closed when the block ends (capsule_exec on a terminal waits for its command whole)."""
    terminal = caller_terminal(meta, tool)
    try:
        yield dataclasses.replace(lent(meta), terminal=terminal)
    finally:
        if terminal is not None:
            os.close(terminal)
