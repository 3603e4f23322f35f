"""An attached stdio ``ccw-mcp``: its client's NDJSON relayed to the state dir's front end.

When another process owns the state dir (``mcp_server/frontdoor.py``), a stdio
``ccw-mcp`` keeps no Runtime and starts no helper: it opens its connection to the
owner's ``frontend.sock`` with its own caller context and tool families
(``frontdoor.opening_line``: the workspace and environment its client's calls are to
run with, and the CCW_TOOLSETS whose tools its client lists and calls), then copies its
client's lines there and the owner's lines (answers, notifications, the owner's own
requests such as ``roots/list``) back, unchanged, so that the client's calls take their
turns with everyone else's.  It reads just enough of each line to know which requests
are in flight: the client's request lines are classified (they are small), the owner's
answers only by their head (``framing.scan_head``; an answer may be a whole file).

Takeover.  When the owner goes away (its socket ends while our client is still there),
requests in flight at that moment are answered with a JSON-RPC error saying that the
front end stopped and to retry: they may have run, or not, and only the client can
decide to send them again.  Then the relay takes the lock itself and hosts the front end
in-process (``_host``: the same CcwServer on frontend.sock, so other attached clients
can follow), or, if another process took it first, waits for that one to answer.  The
client's ``initialize`` (under an id of ours, its answer swallowed) and
``notifications/initialized`` are sent to the new server before anything else, so the
client sees one session throughout.  Its later requests are read only once the new
session stands, so none is lost meanwhile; and those a draining owner refused unread
(error -32001, "shutting down": they never ran) are sent to the next one, not answered,
as is a line whose sending failed (the owner closed first: its newline never left).
While no front end answers, the client's lines are read and held for the next one
(``_attach_holding``); if none answers within ``ATTACH_TIMEOUT_S`` (an owner that drains
finishes its calls first, holding the lock but no longer listening), each held request
is answered with the reason, never left to a traceback, and the server exits 2.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import trio

from mcp_server import framing
from mcp_server.config import Config
from mcp_server.frontdoor import opening_line
from mcp_server.logs import LOGGER
from mcp_server.transports.stdio import claim_stdio
from sandbox.errors import CcwError

READ_CHUNK = 65536
MAX_ANSWER = 256 << 20  # as the socket client accepts (transports/unix.py)
ATTACH_TIMEOUT_S = 60.0  # a new owner recovers promotions and starts before it listens
RELAY_INIT_ID = "ccw-relay-initialize"
MAX_HELD = 1024  # lines read from the client before any front end answers (as ndjson's MAX_PENDING)


class Relay:
    """One client's session, relayed to whichever front end owns the state dir."""

    def __init__(self, config: Config, client_in: trio.abc.ReceiveStream, client_out: trio.abc.SendStream) -> None:
        self.config = config
        self.client_in = client_in
        self.client_out = client_out
        self.client_lines = framing.LineSplitter()
        self.handshake: list[dict[str, Any]] = []  # the client's initialize and initialized
        self.pending: dict[tuple[str, Any], tuple[Any, bytes]] = {}  # forwarded, not yet answered: (id, line)
        self.resend: list[bytes] = []  # refused by a draining owner unread: for the next one
        self.held: list[bytes] = []  # read while no front end answered yet: sent once one does
        self.client_ended = False
        self.host_draining = trio.Event()  # ends a front end we host after a takeover
        # Our client's calls run in the owner's process, but with our own context and tools:
        # the workspace its file tools default to, the environment its commands see, and
        # the families it was given (no more, though the owner may serve more).
        self.opening = opening_line({"cwd": os.getcwd(), "env": dict(os.environ), "workspace": config.workspace},
                                    config.toolsets)

    async def run(self, draining: trio.Event, nursery: trio.Nursery) -> None:
        """Relay until the client's input ends (or ``draining``) and its answers are back."""
        try:
            while True:
                upstream, owner_lines = await self._attach_holding(nursery)
                async with upstream:
                    try:
                        await upstream.send_all(self.opening)
                        await self._replay_handshake(upstream, owner_lines)
                        await self._pump(upstream, owner_lines, draining)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass  # it went away mid-handshake or mid-write: as at the end of its stream
                await self._fail_pending()
                if (self.client_ended and not self.resend) or draining.is_set():
                    return
                LOGGER.info("mcp:relay the front end went away; taking over or attaching to the next")
        finally:
            self.host_draining.set()

    async def _attach_holding(self, nursery: trio.Nursery) -> tuple[trio.SocketStream, framing.LineSplitter]:
        """``_attach``, reading the client meanwhile: what it sends goes to the front end once
        one answers, and if none does, its requests are answered with the reason (an error its
        client can show), which then ends this server (exit 2)."""
        failure: CcwError | None = None
        async with trio.open_nursery() as holding:
            holding.start_soon(self._hold_client)
            try:
                attached = await self._attach(nursery)
            except CcwError as exc:
                failure = exc
            holding.cancel_scope.cancel()
        if failure is not None:
            for line in self.held:
                frame = framing.classify(line)
                if isinstance(frame, framing.Request):
                    await self._to_client(framing.dumps(framing.error_message(
                        frame.id, framing.SHUTTING_DOWN, f"{failure.code}: {failure.message}")))
            raise failure
        return attached

    async def _hold_client(self) -> None:
        while len(self.held) < MAX_HELD:  # past it, the client waits to be read, as by a busy owner
            data = await self.client_in.receive_some(READ_CHUNK)
            if not data:
                self.client_ended = True
                return
            for event in self.client_lines.feed(data):
                if isinstance(event, framing.Oversized):
                    await self._to_client(framing.dumps(framing.oversized_answer(event, False)))
                else:
                    self.held.append(event.data)

    async def _attach(self, nursery: trio.Nursery) -> tuple[trio.SocketStream, framing.LineSplitter]:
        from mcp_server import frontdoor

        path = str(frontdoor.FrontendPaths.of(self.config.state_dir).socket)
        with trio.move_on_after(ATTACH_TIMEOUT_S):
            while True:
                lock = frontdoor.try_lock(self.config.state_dir)
                if lock is not None:
                    await nursery.start(_host, self.config, lock, self.host_draining)
                try:
                    stream = await trio.open_unix_socket(path)
                except OSError:
                    await trio.sleep(0.05)  # the owner holds the lock but is not listening yet
                    continue
                if lock is None:  # another process took over: it must serve what ours would
                    frontdoor.refuse_unlike(self.config)
                return stream, framing.LineSplitter(max_frame=MAX_ANSWER)
        owner = frontdoor.owner_of(self.config.state_dir) or {}
        raise CcwError("UNAVAILABLE", (
            f"the ccw front end of state dir {self.config.state_dir} (pid {owner.get('pid', '?')}) did not answer "
            f"within {ATTACH_TIMEOUT_S:g} s: it holds the state dir but does not listen, as while it finishes the "
            "calls it ran before being asked to stop; start this server again once it has exited"))

    async def _replay_handshake(self, upstream: trio.SocketStream, owner_lines: framing.LineSplitter) -> None:
        """Open the client's session again on a new front end (nothing on a first attach),
        then send it what the last one refused unread."""
        for message in self.handshake:
            if message.get("method") == "initialize":
                await upstream.send_all(framing.dumps({**message, "id": RELAY_INIT_ID}) + b"\n")
                await _answer_to(upstream, owner_lines, RELAY_INIT_ID)
            else:
                await upstream.send_all(framing.dumps(message) + b"\n")
        resend, self.resend = [*self.resend, *self.held], []
        self.held = []
        for line in resend:
            self._note(line)
            await upstream.send_all(line + b"\n")

    async def _pump(self, upstream: trio.SocketStream, owner_lines: framing.LineSplitter, draining: trio.Event) -> None:
        reading = trio.CancelScope()

        async def to_owner() -> None:
            with reading:
                await self._client_to_owner(upstream)
            # Input ended (or a drain began): the owner answers what it has, then closes.
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await upstream.send_eof()

        async def stop_reading_on_drain() -> None:
            await draining.wait()
            reading.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(to_owner)
            nursery.start_soon(stop_reading_on_drain)
            await self._owner_to_client(upstream, owner_lines)
            nursery.cancel_scope.cancel()  # the owner is gone: stop reading the client for now

    async def _client_to_owner(self, upstream: trio.SocketStream) -> None:
        while True:
            data = await self.client_in.receive_some(READ_CHUNK)
            if not data:
                self.client_ended = True
                return
            events = self.client_lines.feed(data)
            for n, event in enumerate(events):
                if isinstance(event, framing.Oversized):
                    await self._to_client(framing.dumps(framing.oversized_answer(event, False)))
                    continue
                self._note(event.data)
                try:
                    await upstream.send_all(event.data + b"\n")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._unsent(event.data, events[n + 1:])
                    return  # the owner's answers still come until its end; then the next one

    async def _unsent(self, line: bytes, rest: list[framing.Event]) -> None:
        """Keep for the next front end a line the owner stopped reading before it was whole
        (its newline never left, so it never ran) and the lines read with it."""
        frame = framing.classify(line)
        if isinstance(frame, framing.Request):
            with contextlib.suppress(TypeError):
                self.pending.pop(framing.id_key(frame.id), None)
            if frame.method == "initialize":
                self.handshake = []  # the next one gets it as the client sent it, answered to the client
        self.resend.append(line)
        for event in rest:
            if isinstance(event, framing.Oversized):
                await self._to_client(framing.dumps(framing.oversized_answer(event, False)))
            else:
                self.resend.append(event.data)

    def _note(self, line: bytes) -> None:
        """Keep what a takeover needs: the handshake, and which requests are in flight."""
        frame = framing.classify(line)
        if isinstance(frame, framing.Request):
            with contextlib.suppress(TypeError):
                self.pending[framing.id_key(frame.id)] = (frame.id, line)
            if frame.method == "initialize":
                self.handshake = [frame.message]
        elif isinstance(frame, framing.Notification) and frame.method == "notifications/initialized":
            self.handshake = [*self.handshake[:1], frame.message]

    async def _owner_to_client(self, upstream: trio.SocketStream, owner_lines: framing.LineSplitter) -> None:
        while True:
            try:
                data = await upstream.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                return
            for event in owner_lines.feed(data):
                if isinstance(event, framing.Oversized):
                    LOGGER.warning(f"mcp:relay an answer over {MAX_ANSWER} bytes was dropped")
                    continue
                request_id, method = framing.scan_head(event.data[: framing.HEAD_SCAN])
                if method is None and framing.is_valid_id(request_id):
                    sent = self.pending.pop(framing.id_key(request_id), None)
                    if sent is not None and _refused_unread(event.data):
                        self.resend.append(sent[1])  # never ran: the next front end gets it
                        continue
                await self._to_client(event.data)

    async def _to_client(self, frame: bytes) -> None:
        try:
            await self.client_out.send_all(frame + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.client_ended = True  # the client stopped reading: nobody is left to answer

    async def _fail_pending(self) -> None:
        stopped = (f"the ccw front end serving state dir {self.config.state_dir} stopped before answering; "
                   "this server now attaches to the next one: retry the request")
        for request_id, _line in list(self.pending.values()):
            await self._to_client(framing.dumps(framing.error_message(request_id, framing.SHUTTING_DOWN, stopped)))
        self.pending.clear()


def _refused_unread(frame: bytes) -> bool:
    """Whether an answer is a draining owner's refusal of a request it never ran."""
    if len(frame) > 4096 or b'"error"' not in frame:
        return False
    error = json.loads(frame).get("error")
    return (isinstance(error, dict) and error.get("code") == framing.SHUTTING_DOWN
            and "shutting down" in str(error.get("message")))


async def _answer_to(upstream: trio.SocketStream, owner_lines: framing.LineSplitter, request_id: str) -> None:
    """Read the owner's lines up to the answer to ``request_id`` (nothing else comes first)."""
    while True:
        data = await upstream.receive_some(READ_CHUNK)
        if not data:
            raise trio.BrokenResourceError("the front end closed during the handshake")
        for event in owner_lines.feed(data):
            if isinstance(event, framing.Line) and json.loads(event.data).get("id") == request_id:
                return


async def _host(config: Config, lock: Any, draining: trio.Event,
                task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Be the state dir's front end in this process (after a takeover) until ``draining``."""
    from mcp_server import frontdoor

    try:
        lock.record("stdio", daemon=False, config=config)
        async with frontdoor.running_app(config) as app:
            await frontdoor.serve(app, draining, task_status=task_status)
    finally:
        lock.release()


async def serve(config: Config, draining: trio.Event,
                task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Relay stdin/stdout to the state dir's front end until stdin closes."""
    with claim_stdio() as (wire_in, wire_out):
        reader = trio.lowlevel.FdStream(wire_in)
        writer = trio.lowlevel.FdStream(wire_out)
        async with reader, writer, trio.open_nursery() as nursery:
            task_status.started("-")
            await Relay(config, reader, writer).run(draining, nursery)
