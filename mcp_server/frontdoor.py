"""One front end per state dir: its lock, its socket, and serving the clients that attach.

Why one.  A front end keeps state that is not in the database: a capsule's turns
(``capsules/turns.py``: calls on one capsule take turns in arrival order), its live runs
(``capsules/run.py``), and the sessions behind an "egress" capsule's proxy
listeners (``capsules/networks.py``), which record each connection.  Two front ends on
one state dir each keep their own: an exec sent to one while the other runs a command
in that capsule is refused by the helper (CONFLICT, the capsule is busy) instead of
waiting its turn, and when both hold a capsule's listeners, a connection is recorded by
whichever process accepts it.  Moving turns and records into the helper would put
front-end bookkeeping into the privileged process; putting them in the database would
need a cross-process queue and leave the listeners split.  So there is one front end
per state dir and every client talks to it:

* ``<state>/frontend.lock`` (flock, held for the process's life; the kernel releases it
  when the process dies, so there is no stale owner to clean up) says who the OWNER is.
  Its content, rewritten by each owner, is ``{"pid", "endpoint", "daemon"}``, so that an
  error can name it.
* ``<state>/frontend.sock`` (mode 0600, and each peer's SO_PEERCRED uid must be ours)
  serves MCP as NDJSON with the owner's own ``CcwServer``: every client's calls share its
  turns, runs and egress sessions.  Binding reuses ``transports/unix.py`` (a stale file
  left by a dead owner is removed, a live one is an error); as the lock is held, a live
  listener there cannot be a legitimate owner.
* A ``ccw-mcp`` that gets the lock serves its own endpoint and frontend.sock.  A stdio
  ``ccw-mcp`` that does not ATTACHES: it relays its client's messages to frontend.sock
  (``transports/relay.py``) with no Runtime and no helper of its own, and takes over
  when the owner goes away.  A socket or HTTP ``ccw-mcp`` that does not get the lock
  exits with status 2 (CONFLICT, naming the owner's pid): those endpoints serve other
  clients that chose that address, and silently relaying them to a process that may
  end with its agent's session would surprise them.  An owner that is only the CLI's
  daemon (below) yields to a ``ccw-mcp`` when no one else is connected and it keeps no
  service or forwarded port (``frontdaemon.ask_to_yield``: "now", it drains, the new
  server owns, its log on its own stderr); while a command or an attached server is
  connected (a person's long exec), or it keeps one (frontdaemon.py says why), it answers
  "busy" and stays, and a stdio ``ccw-mcp`` attaches to it, answered at once: a drained
  daemon stops listening but holds the lock until that command ends.  An attached server's
  client is served with what is its own: the relay opens its connection with its
  caller context and its tool families (``opening_line``: its cwd, environment,
  ``CCW_WORKSPACE`` and ``CCW_TOOLSETS``), so its file tools default to its workspace,
  its commands see its whitelisted variables' values, and it lists and may call the
  tools of its own families, not the owner's (``CcwServer.tool_list``: a family the
  owner does not serve its own clients is served to it all the same, and one the owner
  serves beyond it is neither listed nor callable; a connection that lends none, as
  the ``ccw`` command's, is served the owner's).  Roots, which most clients declare,
  are asked of each connection's client (the owner's ``roots/list`` passes through the
  relay) and kept per connection.  The settings an owner applies to every client
  (``SHARED_SETTINGS``: the helper, the REAPI cluster, the schema catalogue) are recorded
  with the lock, with the tool families it can serve, and a ``ccw-mcp`` whose settings
  differ, or that names a family the owner cannot serve (another ccw version), does not
  attach (``refuse_unlike``: CONFLICT, exit 2) rather than serve its client with another
  helper, or fewer tools, than it was given.
* The ``ccw`` command never runs a front end in-process beside a possible owner.  It
  is an MCP client of frontend.sock (``cli/frontclient.py``); when nobody answers, it
  starts a detached front-end DAEMON for the state dir (``ccw-mcp`` on frontend.sock,
  which exits after ``DAEMON_IDLE_S`` without a connection, unless it keeps a service or
  a forwarded port) and attaches to whichever front end then owns the lock.  ``ccw helper
  status`` shows it, ``ccw helper stop`` stops it before the helper (frontdaemon.py: the
  daemon's control from outside).

The owner runs every call with its own environment, so the CLI sends absolute paths and
its caller context (``_meta["ccw/caller"]``: cwd, PATH, HOME) with each call; the owner
honours it only from a connection trusted to be our own uid (stdio, frontend.sock:
``CALLER_TRUSTED``), for capsule_create's toolchain discovery.

frontend.sock is also the one connection that carries descriptors: ``ccw capsule shell``
sends its pty slave (SCM_RIGHTS) with the bytes of its ``capsule_exec`` call, which says
so in ``_meta["ccw/terminal"]``.  ``_FdReceiver`` keeps what arrives (a few at most, the
rest closed; close-on-exec) for the connection's next call that names one
(``caller.caller_terminal``), and closes what no call took when the connection ends.
The helper still checks the descriptor (a read-write pty slave of the caller's own,
``sandbox.access.check_terminal``) before the jail gets it.  So a shell is an exec like
an agent's: in the capsule's one queue, with the egress sessions of this process.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from mcp_server.caller import (
    CALLER_CONTEXT,
    CALLER_META,
    CALLER_TRUSTED,
    PASSED_FDS,
    PassedFds,
)
from mcp_server.config import PROFILES, TOOLSETS, Config
from mcp_server.logs import LOGGER
from mcp_server.statedir import make_state_dir
from mcp_server.transports.unix import listen
from sandbox.errors import CcwError

if TYPE_CHECKING:  # the server and its transport import the SDK (a second): a ``ccw`` command needs neither
    from mcp_server.server import CcwServer

DAEMON_IDLE_S = 300.0  # a CLI-started front end with no connection for this long exits
_FD_SIZE = array.array("i").itemsize


@dataclass(frozen=True)
class FrontendPaths:
    """Where a state dir's front end keeps its lock, socket and (daemon) log."""

    lock: Path
    socket: Path
    log: Path

    @classmethod
    def of(cls, state_dir: str) -> FrontendPaths:
        """The paths for ``state_dir``."""
        root = Path(state_dir)
        return cls(root / "frontend.lock", root / "frontend.sock", root / "frontend.log")


class FrontendLock:
    """The held front-end lock of a state dir (released by ``release`` or by exit)."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    def record(self, endpoint: str, daemon: bool, config: Config) -> None:
        """Write who owns the state dir, for errors and ``ccw helper status`` to name, the
        settings it serves every client with and the tool families it can serve an
        attached one (``refuse_unlike``)."""
        data = json.dumps({"pid": os.getpid(), "endpoint": endpoint, "daemon": daemon,
                           "settings": shared_settings(config), "families": list(SERVABLE)}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        """Give the state dir up (the owner record is left; only a lock holder trusts it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def try_lock(state_dir: str) -> FrontendLock | None:
    """The state dir's front-end lock if nobody holds it, else None (never waits)."""
    paths = FrontendPaths.of(state_dir)
    make_state_dir(state_dir)
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return FrontendLock(fd, paths.lock)


def owner_of(state_dir: str) -> dict[str, Any] | None:
    """The owner's record (pid, endpoint, daemon) while somebody holds the lock, else None."""
    paths = FrontendPaths.of(state_dir)
    try:
        fd = os.open(paths.lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held: the record is the owner's
        else:
            return None  # nobody holds it: whatever it says is stale
        try:
            record = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            record = {}  # being rewritten by a new owner this instant
        return record if isinstance(record, dict) else {}
    finally:
        os.close(fd)


# The settings an owner applies to every client's calls, attached ones included: where
# the helper and the REAPI cluster are, the schema tools' catalogue.  (The tool families,
# workspace and environment are each client's own: lent per connection or call.)
SHARED_SETTINGS = ("helper_socket", "reapi_url", "reapi_parallel", "reapi_platform", "schemas_dir",
                   "examples_dir", "backend_url", "backend_assets_path", "max_batch")
SERVABLE = (*TOOLSETS, *PROFILES)  # the CCW_TOOLSETS names whose tools this process can serve


def shared_settings(config: Config) -> dict[str, Any]:
    """``config``'s SHARED_SETTINGS, as JSON values."""
    return {name: getattr(config, name) for name in SHARED_SETTINGS}


def refuse_unlike(config: Config) -> None:
    """CONFLICT if the state dir's owner serves other SHARED_SETTINGS than ``config`` asks
    (an attached ``ccw-mcp`` would give its client the owner's helper, silently), or
    cannot serve one of its tool families (its client would miss tools it was given).
    An owner that recorded neither (still starting) is not compared."""
    owner = owner_of(config.state_dir) or {}
    theirs = owner.get("settings")
    if not isinstance(theirs, dict):
        return
    env_names = {f.name: f.metadata.get("env", f.name) for f in dataclasses.fields(Config)}
    ours = shared_settings(config)
    differ = [name for name in SHARED_SETTINGS if name in theirs and theirs[name] != ours[name]]
    recorded = owner.get("families")
    servable = [str(name) for name in recorded] if isinstance(recorded, list) else None
    unserved = [name for name in config.toolsets if servable is not None and name not in servable]
    if differ or unserved:
        shown = [f"{env_names[name]}: it has {theirs[name]!r}, this one {ours[name]!r}" for name in differ]
        if unserved:
            shown.append(f"CCW_TOOLSETS: it cannot serve {', '.join(unserved)} (it serves {', '.join(servable or ())})")
        raise CcwError("CONFLICT", (
            f"state dir {config.state_dir} is served by ccw-mcp pid {owner.get('pid', '?')} with other settings "
            f"({'; '.join(shown)}); a stdio ccw-mcp attaches to it and would serve its client with those. Start "
            "this one with the same settings, or give it its own CCW_STATE_DIR"),
            {"settings": differ + (["toolsets"] if unserved else [])})


OPENING = b'{"' + CALLER_META.encode() + b'":'  # how a connection's opening line starts (``opening_line``)
OPENING_TOOLSETS = "ccw/toolsets"  # the opening line's key for the attached server's CCW_TOOLSETS
OPENING_YIELD = "ccw/yield"  # an opening that only asks the daemon to yield (``frontdaemon.ask_to_yield``)
OPENING_HOLDS = "ccw/holds"  # one that only asks what the owner keeps (``frontdaemon.ask_what_it_holds``)
MAX_OPENING = 4 << 20  # an environment is a few KiB; a line longer than this is no opening


def opening_line(caller: Mapping[str, Any], toolsets: Sequence[str]) -> bytes:
    """The line an attached ``ccw-mcp`` opens its connection with: its caller context
    (cwd, environment, CCW_WORKSPACE) for every call it relays, and its tool families."""
    opening = {CALLER_META: dict(caller), OPENING_TOOLSETS: list(toolsets)}
    return json.dumps(opening, separators=(",", ":")).encode() + b"\n"


@dataclass(frozen=True)
class Opening:
    """What a connection's opening line lends it for its whole life (``opening_line``)."""

    caller: dict[str, Any] | None  # the caller context of calls that lend none themselves
    toolsets: tuple[str, ...] | None  # the families and profiles its client is served; None: the owner's
    yield_asked: bool = False  # the connection only asks the daemon to yield (``frontdaemon.ask_to_yield``)
    holds_asked: bool = False  # it only asks what the owner keeps (``frontdaemon.ask_what_it_holds``)

    @classmethod
    def parse(cls, line: bytes) -> Opening | None:
        """The opening in ``line`` (which starts as one does), or None if it is not JSON."""
        try:
            opening = json.loads(line)
        except ValueError:
            return None
        if not isinstance(opening, dict):
            return None
        caller = opening.get(CALLER_META)
        toolsets = _lent_toolsets(opening.get(OPENING_TOOLSETS, None))
        return cls(caller if isinstance(caller, dict) else None, toolsets, opening.get(OPENING_YIELD) is True,
                   opening.get(OPENING_HOLDS) is True)


def _lent_toolsets(lent: Any) -> tuple[str, ...] | None:
    """The tool families an opening names: None if it names none (the owner's then apply);
    a malformed or unknown name chooses no tool, so a client is never served more than
    its own ``ccw-mcp`` was given.  (A relay does not attach to an owner that lacks one of
    its families: ``refuse_unlike``.  This is the owner's own check, in case one does.)"""
    if lent is None:
        return None
    names = lent if isinstance(lent, list) else [lent]
    known = tuple(name for name in names if isinstance(name, str) and name in SERVABLE)
    if len(known) != len(names):
        LOGGER.warning(f"mcp:frontend an attached client named tool families this server does not know: {lent!r}; "
                       f"serving it only {', '.join(known) or 'no tools'}")
    return known


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", raw)[1])


async def serve(
    app: CcwServer, draining: trio.Event, idle_s: float | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve MCP on frontend.sock until ``draining`` (its requests answered) or, with ``idle_s``
    (the CLI's daemon, which also yields), until no client has been connected for that long."""
    clients = _Clients()
    await listen(str(FrontendPaths.of(app.config.state_dir).socket), 0o600,
                 functools.partial(_stop_accepting, draining, clients=clients, idle_s=idle_s,
                                   holding=app.runtime.services.holding),
                 lambda stream: _serve_client(app, stream, draining, clients, yields=idle_s is not None,
                                              holding=app.runtime.services.holding, held=app.runtime.services.held),
                 task_status=task_status)


@contextlib.asynccontextmanager
async def running_app(config: Config) -> AsyncIterator[CcwServer]:
    """The state dir's CcwServer, started (promotions recovered, kept services brought back and
    forwarded ports reopened: capsules/services.py) and closed after use."""
    from mcp_server.server import CcwServer
    from mcp_server.state import State

    state = State(config.state_dir)
    try:
        app = CcwServer(config, state)
        app.startup()
        try:
            await app.runtime.reopen_kept()
            yield app
        finally:
            with trio.CancelScope(shield=True):
                await app.runtime.aclose()
    finally:
        state.close()


class _Clients:
    """How many clients are connected, and since when none is."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = trio.Event()

    def bump(self, delta: int) -> None:
        self.count += delta
        self.changed.set()
        self.changed = trio.Event()


async def _stop_accepting(
    draining: trio.Event, accepting: trio.CancelScope, clients: _Clients, idle_s: float | None,
    holding: Callable[[], bool] = lambda: False,
) -> None:
    """Cancel ``accepting`` at the drain, or (``idle_s``) once no client came for that long
    and nothing is ``holding`` it (a service running, a port forwarded: capsules/services.py)."""
    if idle_s is None:
        await draining.wait()
    else:
        async with trio.open_nursery() as either:
            async def idle() -> None:
                while True:
                    if clients.count == 0:
                        with trio.move_on_after(idle_s):
                            await clients.changed.wait()
                            continue
                        if holding():
                            continue
                        LOGGER.info(f"mcp:frontend idle for {idle_s:g} s: exiting")
                        draining.set()
                        return
                    await clients.changed.wait()

            async def drained() -> None:
                await draining.wait()
                either.cancel_scope.cancel()

            either.start_soon(idle)
            either.start_soon(drained)
    accepting.cancel()


async def _serve_client(app: CcwServer, stream: trio.SocketStream, draining: trio.Event, clients: _Clients,
                        yields: bool = False, holding: Callable[[], bool] = lambda: False,
                        held: Callable[[], list[str]] = list) -> None:
    async with stream:
        uid = peer_uid(stream.socket)  # type: ignore[arg-type]
        if uid != os.getuid():
            # The socket is 0600, so only our uid (or root) can connect; root is not us
            # either: calls carry the caller's environment, which only we may give.
            LOGGER.warning(f"mcp:frontend refused a client of uid {uid} (serving uid {os.getuid()})")
            return
        clients.bump(1)
        passed = PassedFds()
        try:
            CALLER_TRUSTED.set(True)
            PASSED_FDS.set(passed)
            reader = _FdReceiver(stream, passed)
            opening = await reader.opening()
            if opening is not None and opening.holds_asked:
                await stream.send_all(json.dumps({OPENING_HOLDS: held()}).encode() + b"\n")
                return
            if opening is not None and opening.yield_asked:
                # Alone (this asker aside) and keeping nothing: drain now.  Otherwise someone's
                # calls would be cut short or refused, or the services and forwarded ports it
                # keeps would end, and the asker attaches instead (frontdaemon.py).
                now = yields and clients.count == 1 and not draining.is_set() and not holding()
                await stream.send_all(json.dumps({OPENING_YIELD: "now" if now else "busy"}).encode() + b"\n")
                if now:
                    LOGGER.info("mcp:frontend yielding to a ccw-mcp that starts on this state dir")
                    draining.set()
                return
            CALLER_CONTEXT.set(opening.caller if opening is not None else None)
            # An attached ccw-mcp's client lists and calls the tools of its own families.
            lent = opening.toolsets if opening is not None else None
            tools = app.tool_list(lent) if lent is not None else app.tools
            from mcp_server.transports.ndjson import NdjsonConnection

            await NdjsonConnection(app, reader, stream, draining, tools).run()
        finally:
            passed.close()
            clients.bump(-1)


class _FdReceiver(trio.abc.ReceiveStream):
    """A client's bytes, with the descriptors that came along (SCM_RIGHTS) kept in ``passed``.

    ``ccw capsule shell`` sends its terminal with the bytes of its ``tools/call``; the
    kernel delivers it with the first of those bytes and never joins them to bytes sent
    before, so it is kept before the line that names it is read.  MSG_CMSG_CLOEXEC: a
    descriptor is never inherited by what we spawn before a call takes it."""

    def __init__(self, stream: trio.SocketStream, passed: PassedFds) -> None:
        self.stream = stream
        self.passed = passed
        self.unread = b""  # read by ``opening``, not part of it: the connection's first bytes

    async def opening(self) -> Opening | None:
        """What the client lends for its whole connection, if its first line is
        ``{"ccw/caller": {...}, ...}`` (an attached ccw-mcp's: ``opening_line``); else None,
        and what it sent is read again as the connection's first bytes."""
        data = b""
        while b"\n" not in data and (len(data) < len(OPENING) or data.startswith(OPENING)):
            chunk = await self.receive_some()
            if not chunk or len(data) > MAX_OPENING:
                break
            data += chunk
        line, newline, rest = data.partition(b"\n")
        if not (newline and line.startswith(OPENING)):
            self.unread = data
            return None
        opening = Opening.parse(line)
        if opening is None:  # not JSON after all: the connection reads it, and answers a parse error
            self.unread = data
            return None
        self.unread = rest
        return opening

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Up to ``max_bytes`` of the client's bytes (b"" at its end)."""
        if self.unread:
            data, self.unread = self.unread, b""
            return data
        sock: Any = self.stream.socket
        try:
            data, ancillary, _flags, _ = await sock.recvmsg(
                max_bytes or 65536, socket.CMSG_SPACE(PassedFds.LIMIT * _FD_SIZE), socket.MSG_CMSG_CLOEXEC)
        except OSError as exc:
            # As trio's SocketStream says it: a client that closed with our answers unread
            # resets the connection (ECONNRESET); raised as itself, it ended the whole front end.
            raise trio.BrokenResourceError(f"the client's connection failed: {exc}") from exc
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % _FD_SIZE])
                self.passed.add(list(fds))
        return bytes(data)

    async def aclose(self) -> None:
        """Close the connection."""
        await self.stream.aclose()
